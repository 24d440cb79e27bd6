"""hf_specdec: fast, exact, batched speculative decoding inside Hugging Face ``model.generate()``.

    hf_specdec.enable(target)
    out = target.generate(**inputs, assistant_model=draft,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=4),
                          return_dict_in_generate=True)
    out.sequences, out.spec_metrics
"""
from .cache import CacheBudgetError
from .call.config import SpecConfig
from .call.metrics import SpecMetrics
from .call.timeline import record_timeline
from .draft_head import DraftHead, load_draft_head, save_draft_head
from .enable import enable
from .generate import SpecDecodeOutput, speculative_generate
from .reduced_vocab import reduce_vocab
from .reduced_vocab_io import load_reduced_draft, save_reduced_draft
from .warmup import warmup

__all__ = ["CacheBudgetError", "DraftHead", "SpecConfig", "SpecDecodeOutput", "SpecMetrics", "enable",
           "load_draft_head", "load_reduced_draft", "record_timeline", "reduce_vocab", "save_draft_head",
           "save_reduced_draft", "speculative_generate", "warmup"]
__version__ = "0.1.0"
