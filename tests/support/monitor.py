"""Helpers and fixtures shared by tests/unit/test_monitor.py and tests/e2e/test_monitor_e2e.py."""

from __future__ import annotations

import torch

from conftest import CORPUS, tiny_config

PROBE = [f"{t} ({i})" for i, t in enumerate(CORPUS[:6])] + [
    "Rivers carry sediment to the sea.", "The committee met on Tuesday to vote.",
    "for i in range(10): print(i)", "Photosynthesis turns light into chemical energy.",
    "She bought three apples and a loaf of bread.", "Integrals measure the area under a curve.",
]


def make_tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir("llama"))


def dropout_llama(seed=0):
    from transformers import LlamaForCausalLM

    cfg = tiny_config("llama")
    cfg.attention_dropout = 0.3  # dropout > 0: training draws from the torch generator
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = 1, 2, 3
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


# ---------------------------------------------------------------------- a real Trainer run
class Rows(torch.utils.data.Dataset):
    def __init__(self, n=80, T=12, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, 256, (n, T), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}

