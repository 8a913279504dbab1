"""The feature reader on a real S3 server: one sample is fetched by a byte-range GET of its part."""

import pytest
from support.feature_fixtures import commit_parts

from flashdraft.features.reader import OfflineReader
from flashdraft.storage.store import ObjectStore

pytestmark = pytest.mark.integration


def test_single_sample_byte_range_fetch_on_s3(s3_storage, tiny_cfg):
    s3 = ObjectStore(s3_storage.root, s3_storage)
    keys = commit_parts(s3, tiny_cfg, {0: [6]})
    reader = OfflineReader(s3, shuffle=False)
    whole = [s.sample_id for s in reader]
    one = reader.fetch(keys[0], 4)
    assert one.sample_id == whole[4] == "0-0-4"
    assert one.features.shape[1] == 5 * 256
