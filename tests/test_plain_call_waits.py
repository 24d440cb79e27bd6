"""A plain ``generate()`` of an enabled model (no ``spec_config``) waits while hf_specdec works under
``CAPTURE_LOCK`` in another thread: a background compilation traces and captures CUDA graphs, which a compiled
plain call's own compilation and graphs can break. The wait says why; a
call that finds the lock free says nothing."""
import threading
import warnings

import torch


def test_a_plain_call_waits_for_work_under_the_capture_lock_and_says_so():
    import hf_specdec
    from hf_specdec.runner.graphs import CAPTURE_LOCK
    from models import left_padded_prompts, make_model

    target = hf_specdec.enable(make_model("llama", seed=5))
    ids, mask = left_padded_prompts(2, seed=1)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=4)
    with warnings.catch_warnings(record=True) as free:
        warnings.simplefilter("always")
        want = target.generate(**kw)
    assert not [w for w in free if "hf_specdec" in str(w.message)]

    held, release, out = threading.Event(), threading.Event(), {}

    def compiling():  # what BackgroundCompile._run holds while it traces
        with CAPTURE_LOCK:
            held.set()
            release.wait(60)

    def plain():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["ids"] = target.generate(**kw)
        out["warnings"] = [str(w.message) for w in caught]

    worker = threading.Thread(target=compiling)
    worker.start()
    assert held.wait(10)
    call = threading.Thread(target=plain)
    call.start()
    call.join(timeout=1.0)
    assert call.is_alive(), "the plain call ran while another thread held the lock"
    release.set()
    worker.join(timeout=10)
    call.join(timeout=60)
    assert not call.is_alive()
    assert torch.equal(out["ids"], want)
    assert any("waits for the compilation" in w for w in out["warnings"]), out["warnings"]
    assert CAPTURE_LOCK.acquire(blocking=False)  # released after the call
    CAPTURE_LOCK.release()
