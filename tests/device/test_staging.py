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


def test_packed_int64_fields_round_trip_on_16_byte_boundaries() -> None:
    """Triton specialises kernels on 16-byte pointer alignment: every field's view must be
    aligned whatever the batch size, or a batch of the other parity compiles new kernels."""
    from aserve.device.inputs import pack_int64, unpack_int64

    for n in range(1, 8):
        fields = {
            "graph_in": list(range(3 * n)),
            "rows": list(range(n)),
            "gens": [7] * n,
            "extend": list(range(n, 2 * n)),
            "empty": [],
            "odd": [5, 6, 7],
        }
        packed, spans = pack_int64(fields)
        views = unpack_int64(packed.clone(), spans)  # a fresh allocation, as the H2D copy makes
        assert views["graph_in"].tolist() == [fields["graph_in"][i * n : (i + 1) * n] for i in range(3)]
        for name, values in fields.items():
            if name != "graph_in":
                assert views[name].tolist() == values
            assert views[name].data_ptr() % 16 == 0, (n, name)
