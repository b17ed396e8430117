"""The public surface is a promise: changing it must be a deliberate act."""

import bulkfetch


def test_all_is_pinned() -> None:
    assert sorted(bulkfetch.__all__) == [
        "BulkfetchError",
        "Client",
        "Failure",
        "FetchError",
        "Progress",
        "Report",
        "UsageError",
        "__version__",
        "build_options",
        "download",
        "open_dataset",
        "stream",
    ]
    for name in bulkfetch.__all__:
        assert hasattr(bulkfetch, name), name
