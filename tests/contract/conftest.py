"""Fixtures of the contract suite: real servers on 127.0.0.1 (started once per module, stopped
by their own teardown), the image a registry serves, and a DEST prepared for each sink."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helper modules beside this file: pytest puts this directory on sys.path (the default
# "prepend" import mode, as for tests/e2e's getkit).
from contract_http import Getter
from contract_sinks import SINK_CASES, SinkCase, SinkHarness
from contract_sources import OciImage, data_server_args, hostile_server_args, index_server_args

from bulkfetch.testing import ReferenceServer


@pytest.fixture(scope="module")
def data_server() -> Iterator[ReferenceServer]:
    """The listing cases' data set: seed API and S3 bucket (signed, temporary credentials)."""
    with ReferenceServer(*data_server_args()) as server:
        yield server


@pytest.fixture(scope="module")
def index_server() -> Iterator[ReferenceServer]:
    """The same kind of data set as a web server's directory listings (--shape index)."""
    with ReferenceServer(*index_server_args()) as server:
        yield server


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[ReferenceServer]:
    """--hostile-names: attack names on the first page of the seed API and in the bucket."""
    with ReferenceServer(*hostile_server_args()) as server:
        yield server


@pytest.fixture(scope="module")
def getter() -> Iterator[Getter]:
    made = Getter()
    yield made
    made.close()


@pytest.fixture(scope="module")
def oci_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciImage]:
    """A four-layer image pushed with skopeo to Debian's docker-registry, resolved as
    `bulkfetch pull` resolves it, and the options the pull hands the engine."""
    missing = [tool for tool in ("docker-registry", "skopeo") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the OCI source needs {' and '.join(missing)} (bash .ci/run installs them)")
    from bulkfetch.oci.pull import PullOptions, PullResult, engine_options, plan_blobs, resolve
    from bulkfetch.testing.images import LayerSpec, build_image, push
    from bulkfetch.testing.registry import Registry

    work = tmp_path_factory.mktemp("oci")
    layout = work / "layout"
    build_image(layout, "v1", [LayerSpec(31, 20_000), LayerSpec(32, 5_000),
                               LayerSpec(33, 70_000), LayerSpec(34, 1_000)])
    dest = work / "dest"
    dest.mkdir()
    with Registry(work / "registry") as registry:
        push(layout, "v1", registry.address, "contract/app")
        options = PullOptions(refs=(f"{registry.address}/contract/app:v1",), dest=str(dest),
                              plain_http=True, cache_dir="", platform="linux/amd64")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DOCKER_CONFIG", str(work / "no-docker-config"))  # no one's logins
            images = resolve(options, lambda line: None)
        plan = plan_blobs(images, dest, None, PullResult(images, []))
        blobs = {spec.name: (layout / spec.name).read_bytes() for spec in plan.blobs}
        assert len(blobs) == 4, sorted(blobs)
        yield OciImage(engine_options(options, plan), blobs)


@pytest.fixture(params=SINK_CASES, ids=[case.id for case in SINK_CASES])
def sink_case(request: pytest.FixtureRequest) -> SinkCase:
    return request.param


@pytest.fixture
def harness(sink_case: SinkCase, tmp_path: Path) -> Iterator[SinkHarness]:
    made = SinkHarness(sink_case, tmp_path / "dest")
    yield made
    made.finish()  # closes the sinks a test left open (after a failure) and the journal
