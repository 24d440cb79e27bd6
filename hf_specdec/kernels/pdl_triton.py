"""The device side of ``pdl.py``: the one step every kernel launched with PDL starts with (after work that reads
no other kernel's output, such as the GEMV's first weight tile)."""
import triton
import triton.language as tl


@triton.jit
def wait_for_previous_then_release_next(USE_PDL: tl.constexpr):
    """Wait until the previous kernel has finished and its writes are visible, then let the next kernel start:
    wait before trigger, so a kernel that may start is one whose predecessors have all finished."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
