"""The GGUF tensor table read by stepping over the metadata: the same table as gguf-py's full reader, on files with
every kind of metadata value, and a clear ValueError for what is not a GGUF file."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from core.backends.gguf_tensors import read_tensor_infos
from tiny_gguf import write_tiny_gguf


def _table(reader: GGUFReader):
    return [(t.name, int(t.tensor_type), tuple(int(n) for n in t.shape)) for t in reader.tensors]


def _walked(path):
    return [(t.name, t.type_id, t.shape) for t in read_tensor_infos(path)]


def test_a_model_file_reads_as_gguf_py_reads_it(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0, hidden=64, heads=4, kv_heads=2)
    assert _walked(path) == _table(GGUFReader(str(path)))
    assert len(_walked(path)) > 5


def test_every_kind_of_metadata_is_stepped_over(tmp_path):
    path = tmp_path / "kinds.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint8("k.u8", 7)
    writer.add_int16("k.i16", -3)
    writer.add_float64("k.f64", 2.5)
    writer.add_bool("k.bool", True)
    writer.add_string("k.str", "héllo")
    writer.add_array("k.strings", ["a", "bc", "", "déf" * 40])
    writer.add_array("k.ints", [1, 2, 3, 4])
    writer.add_array("k.nested", [[1, 2], [3]])
    writer.add_tensor("first", np.zeros((3, 8), dtype=np.float32))
    writer.add_tensor("second.weight", np.ones((5,), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    walked = _walked(path)
    assert walked == _table(GGUFReader(str(path)))
    assert [name for name, _, _ in walked] == ["first", "second.weight"]
    assert walked[0][2] == (8, 3)          # ggml's order: the row length first


def test_what_is_not_a_gguf_file_is_a_value_error(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0, hidden=64, heads=4, kv_heads=2)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(ValueError, match="ends inside"):
        read_tensor_infos(cut)
    text = tmp_path / "notes.gguf"
    text.write_bytes(b"hello, this is not a model" * 10)
    with pytest.raises(ValueError, match="not a GGUF"):
        read_tensor_infos(text)
