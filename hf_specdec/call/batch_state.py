"""The sequences of one generate() call: a token buffer on the device and host-side lengths.

Buffer row ``b`` holds what plain generate's ``input_ids`` row would hold: the left-padded
prompt (``prompt_width`` columns, ``pads[b]`` of them padding) followed by the generated
tokens; a round writes its drafts after them before it knows which survive. Cache
positions skip the padding: column ``c`` of row ``b`` is position ``c - pads[b]``.

Lengths live on the host because the round loop reads the accepted counts once per round
anyway; everything per token stays on the device.
"""
from __future__ import annotations

import torch


class SequenceBatch:
    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int, k: int):
        B, P = input_ids.shape
        device = input_ids.device
        if attention_mask is None:
            pads = [0] * B
        else:
            mask = attention_mask.to(device=device, dtype=torch.long)
            # Left padding: a row's real tokens are its last `mask.sum()` columns.
            real = mask.sum(-1)
            tail_ok = mask.flip(-1).cumprod(-1).sum(-1) == real
            if not bool(tail_ok.all()):
                raise ValueError(
                    "hf_specdec needs left-padded prompts (attention_mask zeros only at the start of a row); "
                    "set tokenizer.padding_side = 'left'."
                )
            pads = (P - real).tolist()
        if any(p >= P for p in pads):
            raise ValueError("a prompt in the batch is empty (its attention_mask is all zeros); give every row a token.")
        self.prompt_width = P
        self.pads = pads
        self.max_new_tokens = max_new_tokens
        self.k = k
        self.tokens = torch.zeros(B, P + max_new_tokens + k + 2, dtype=torch.long, device=device)
        self.tokens[:, :P] = input_ids
        self.gen_len = [0] * B
        self.finished = [False] * B
        self.device = device

    @property
    def size(self) -> int:
        return len(self.gen_len)

    def end(self, b: int) -> int:
        """Buffer column just past row ``b``'s last committed token."""
        return self.prompt_width + self.gen_len[b]

    def prompt_len(self, b: int) -> int:
        """Real prompt tokens of row ``b`` (padding excluded)."""
        return self.prompt_width - self.pads[b]

    def budget_tokens(self, b: int) -> int:
        """Cache slots row ``b`` may ever hold: its prompt, max_new_tokens and a round's k + 1 lookahead."""
        return self.prompt_len(b) + self.max_new_tokens + self.k + 1

    def real_len(self, b: int) -> int:
        """Committed tokens of row ``b`` without padding (= its cache positions)."""
        return self.end(b) - self.pads[b]

    def _spans(self, rows: list[int], starts: list[int], counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column indices of the spans ``tokens[b, s : s + n]``, packed."""
        r = [b for b, n in zip(rows, counts) for _ in range(n)]
        c = [s + i for s, n in zip(starts, counts) for i in range(n)]
        return torch.tensor(r, device=self.device), torch.tensor(c, device=self.device)

    def gather(self, rows: list[int], starts: list[int], counts: list[int]) -> torch.Tensor:
        """Packed tokens ``tokens[b, s : s + n]`` of each row, ``(sum counts,)``."""
        return self.tokens[self._spans(rows, starts, counts)]

    def append_runs(self, rows: list[int], runs: list[list[int]]) -> None:
        """Write each row's ``run`` right after its committed tokens (lengths are not changed)."""
        flat = torch.tensor([t for run in runs for t in run], device=self.device)
        self.tokens[self._spans(rows, [self.end(b) for b in rows], [len(run) for run in runs])] = flat

    def sequences(self, pad_token_id: int) -> torch.Tensor:
        """Plain generate's output: prompts plus generated tokens, padded to the longest row."""
        width = self.prompt_width + max(self.gen_len, default=0)
        out = self.tokens[:, :width].clone()
        for b, n in enumerate(self.gen_len):
            out[b, self.prompt_width + n:] = pad_token_id
        return out
