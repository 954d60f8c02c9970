from __future__ import annotations

import torch

from aserve.device.staging import PinnedStaging


def test_upload_packs_by_dtype_and_round_trips() -> None:
    st = PinnedStaging(3, pin=False)
    host = {
        "a": torch.arange(5),
        "b": torch.tensor([[1.5, 2.5], [3.5, 4.5]]),
        "c": torch.tensor([7, 8]),
        "d": torch.empty(0, dtype=torch.int64),
    }
    dev = st.upload(0, host, torch.device("cpu"))
    for k, v in host.items():
        assert torch.equal(dev[k], v) and dev[k].shape == v.shape
    # A later slot does not disturb an earlier slot's buffer.
    st.upload(1, {"a": torch.full((5,), 9)}, torch.device("cpu"))
    assert torch.equal(st.buffer(0, torch.int64, 5), torch.arange(5))
