"""S3: where a bucket is and how requests to it are signed."""
