#!/usr/bin/env python3
"""A `sparsa synth --zeros` model directory to a GGUF file for llama.cpp, with no data written.

Issue 21 (llama.cpp beside `sparsa bench` on the H200): a full-depth synthetic GLM-5 is about
130 GB in bf16, more than the device's disk. `sparsa synth --zeros` writes its safetensors as
holes; this script converts such a directory with llama.cpp's own `convert_hf_to_gguf.py`
(imported at run time from the llama.cpp source tree given as the first argument, not copied
here) and writes the GGUF's tensor data as holes too: the GGUF header and tensor infos are
llama.cpp's, the data region is a `truncate` to its full size, so the file reads as zeros,
takes no disk and no time, and no tensor is ever computed (convert's lazy tensors are never
evaluated). Only meaningful for an all-zero source: the data of any other model is dropped.

Then `llama-quantize X.gguf Y.gguf Q4_K_M` makes a real (quantized zeros) file.

The synthetic tokenizer (sparsa's built-in byte-level BPE with GLM's special tokens) is not
one convert knows by its hash, so its pre-tokenizer is given as `--pre` (default `gpt-2`,
the plain byte-level regex, which is what that tokenizer.json's ByteLevel pre-tokenizer
does).

With `--types PLAN` (the output of `llama-quantize --dry-run X.gguf Q4_K_M`, X the bf16 file
this script wrote) each tensor is given the type that llama-quantize chose for it, and the
file is a Q4_K_M (or whatever was planned) GGUF, again all holes: no 40 GB write and no
quantize time. Every ggml block format dequantizes an all-zero block to zeros (its scale is
0), so it holds the same values as quantizing the zeros for real (whose bytes are not all
zero for q5_0: llama-quantize's file differs in bytes, not in values).

usage: gguf_from_synth.py LLAMA_CPP_SRC SYNTH_DIR OUT.gguf [--outtype bf16|f16] [--pre gpt-2]
                          [--types PLAN --ftype Q4_K_M]
"""

import argparse
import os
import sys
import time
from pathlib import Path


def read_plan(path: Path) -> dict:
    """Tensor name -> ggml type name ('q4_K', ...) from `llama-quantize --dry-run` output lines
    `[  i/  n] NAME - [dims], type = bf16, size = A MiB -> B MiB (q4_K)`; tensors it keeps
    as they are have no `(type)` and are not in the result."""
    plan = {}
    for line in path.read_text().splitlines():
        if not line.startswith("[") or "] " not in line:
            continue
        name = line.split("] ", 1)[1].split()[0]
        if line.rstrip().endswith(")") and "->" in line:
            plan[name] = line.rstrip().rsplit("(", 1)[1][:-1]
    if not plan:
        sys.exit(f"--types {path}: no `-> ... (type)` lines (not llama-quantize --dry-run output?)")
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("llama_src", type=Path, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py/)")
    ap.add_argument("model", type=Path, help="a `sparsa synth --zeros --format bf16` directory")
    ap.add_argument("out", type=Path, help="output .gguf")
    ap.add_argument("--outtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--pre", default="gpt-2", help="tokenizer.ggml.pre to write (llama.cpp's name)")
    ap.add_argument("--types", type=Path,
                    help="`llama-quantize --dry-run` output: the type of each tensor")
    ap.add_argument("--ftype", default="Q4_K_M",
                    help="general.file_type to write with --types (a LlamaFileType name less MOSTLY_)")
    ap.add_argument("--write-data", action="store_true",
                    help="write the tensor data for real (for checking the holes against it)")
    a = ap.parse_args()

    src = a.llama_src.resolve()
    sys.path.insert(0, str(src / "gguf-py"))
    sys.path.insert(0, str(src))
    import numpy as np
    import gguf  # llama.cpp's gguf-py, from the tree above
    from gguf.quants import quant_shape_from_byte_shape, quant_shape_to_byte_shape
    import convert_hf_to_gguf as conv  # noqa: E402
    from conversion.base import TextModel

    # The synthetic tokenizer's pre-tokenizer (see the module docs).
    def vocab_pre(self, tokenizer) -> str:
        return a.pre

    TextModel.get_vocab_base_pre = vocab_pre

    # DeepSeek-V3.2's set_vocab asserts that the tokenizer adds a BOS (the release's does;
    # the synthetic one has no BOS token) before its plain GPT-2-style vocabulary: skip the check.
    from conversion.deepseek import DeepseekV32Model

    DeepseekV32Model.set_vocab = lambda self: self._set_vocab_gpt2()

    holes = {"files": 0, "bytes": 0}

    def write_tensors_as_holes(self, *, progress: bool = False) -> None:
        # Header, KV and tensor infos as llama.cpp writes them; then each file's data region
        # (every tensor padded to the alignment, as the tensor-info offsets say) as a hole.
        self.write_ti_data_to_file()
        assert self.fout is not None
        for fout, tensors in zip(self.fout, self.tensors):
            self.write_padding(fout, fout.tell())
            fout.flush()
            start = fout.tell()
            size = sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, self.data_alignment) for ti in tensors.values())
            fout.truncate(start + size)
            fout.seek(start + size)
            for ti in tensors.values():
                ti.tensor = None  # never evaluated
            holes["files"] += 1
            holes["bytes"] += size
        self.state = gguf.gguf_writer.WriterState.WEIGHTS

    if not a.write_data:
        gguf.GGUFWriter.write_tensors_to_file = write_tensors_as_holes
    elif a.types:
        sys.exit("--types: only with holes (the data of a quantized type is not computed here)")

    if a.types:
        plan = read_plan(a.types)
        ftype = gguf.LlamaFileType["MOSTLY_" + a.ftype.upper()]
        add_info = gguf.GGUFWriter.add_tensor_info

        def add_tensor_info(self, name, tensor_shape, tensor_dtype, tensor_nbytes, raw_dtype=None):
            q = plan.get(name)
            if q is not None:
                qt = gguf.GGMLQuantizationType[q.upper()]
                # the element shape (numpy order, the row ne0 last); a bf16 tensor comes as bytes
                es = list(tensor_shape)
                if raw_dtype is not None and np.dtype(tensor_dtype) == np.uint8:
                    es = list(quant_shape_from_byte_shape(es, raw_dtype))
                bs = quant_shape_to_byte_shape(es, qt)
                return add_info(self, name, bs, np.dtype(np.uint8), int(np.prod(bs)), raw_dtype=qt)
            return add_info(self, name, tensor_shape, tensor_dtype, tensor_nbytes, raw_dtype)

        gguf.GGUFWriter.add_tensor_info = add_tensor_info
        add_ft = gguf.GGUFWriter.add_file_type
        gguf.GGUFWriter.add_file_type = lambda self, _ft: add_ft(self, ftype)

    t0 = time.time()
    sys.argv = ["convert_hf_to_gguf.py", str(a.model), "--outfile", str(a.out), "--outtype", a.outtype]
    conv.main()
    st = os.stat(a.out)
    print(
        f"gguf_from_synth: {a.out}: {st.st_size / 1e9:.2f} GB ({st.st_blocks * 512 / 1e6:.1f} MB on disk), "
        f"{holes['bytes'] / 1e9:.2f} GB of tensor data as holes, pre={a.pre}"
        + (f", {a.ftype} from {a.types}" if a.types else "")
        + f", {time.time() - t0:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
