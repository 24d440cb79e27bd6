"""GPU smoke check: greedy speculative output equals plain greedy generate on CUDA (Triton kernels),
for random Llama models in fp32 and bf16, batch 1 and 8. Prints one line per case."""
import copy
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_specdec


def main():
    assert torch.cuda.is_available()
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
        target = LlamaForCausalLM(cfg).to("cuda", dtype).eval()
        with torch.no_grad():
            target.lm_head.weight.mul_(8)
        hf_specdec.enable(target)
        for draft_kind in ("copy", "noisy"):
            draft = copy.deepcopy(target)
            if draft_kind == "noisy":
                with torch.no_grad():
                    for p in draft.parameters():
                        p.add_(torch.randn_like(p) * 0.3 * p.float().std().to(p.dtype))
            for batch in (1, 8):
                ids = torch.randint(3, 4096, (batch, 37), device="cuda")
                mask = torch.ones_like(ids)
                mask[1:, :11] = 0
                kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=64,
                          eos_token_id=None, pad_token_id=0)
                t0 = time.perf_counter()
                plain = target.generate(**kw)
                t1 = time.perf_counter()
                out = target.generate(**kw, assistant_model=draft, return_dict_in_generate=True,
                                      spec_config=hf_specdec.SpecConfig(num_speculative_tokens=4))
                t2 = time.perf_counter()
                same = (plain == out.sequences).float().mean().item()
                m = out.spec_metrics
                print(f"{str(dtype):15s} {draft_kind:5s} batch {batch}: identical {same:.3f} "
                      f"acc {m.acceptance_rate:.2f} plain {t1 - t0:.2f}s spec {t2 - t1:.2f}s "
                      f"(propose {m.propose_seconds:.2f} score {m.score_seconds:.2f} verify {m.verify_seconds:.2f})",
                      flush=True)
                if dtype == torch.float32 and same < 1.0:
                    ok = False
                if draft_kind == "copy" and dtype == torch.float32 and m.acceptance_rate < 1.0:
                    ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
