"""Container images: references, registries, OCI layouts."""
