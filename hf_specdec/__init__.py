"""hf_specdec: fast, exact, batched speculative decoding inside Hugging Face ``model.generate()``.

    hf_specdec.enable(target)
    out = target.generate(**inputs, assistant_model=draft,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=4),
                          return_dict_in_generate=True)
    out.sequences, out.spec_metrics
"""
from .cache import CacheBudgetError
from .config import SpecConfig
from .enable import enable
from .generate import SpecDecodeOutput, speculative_generate
from .metrics import SpecMetrics

__all__ = ["CacheBudgetError", "SpecConfig", "SpecDecodeOutput", "SpecMetrics", "enable", "speculative_generate"]
__version__ = "0.1.0"
