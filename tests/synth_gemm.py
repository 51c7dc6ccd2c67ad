"""Small Kineto GPU traces with shapes (record_shapes=True), for why-kernel-efficiency.

Each rank's trace runs ``steps`` times: an ``aten::linear`` ([M, K] x weight [N, K]) whose
``aten::addmm`` launches (``cudaLaunchKernel``, correlation id) a bias copy and a GEMM kernel, a
causal ``aten::_scaled_dot_product_flash_attention`` ([B, H, L, D]) launching one kernel, and an
``aten::mm`` from another thread. Kernel times are the FLOPs at ``tflops`` (``slow`` maps rank ->
factor: that rank's GEMM and attention kernels run ``factor`` times longer), so the expected
TFLOP/s is known exactly. ``shapes=False`` drops every ``Input Dims`` (record_shapes=False);
``device`` is the deviceProperties name (None: no deviceProperties); ``flash_forward``: the attention
op calls ``aten::_flash_attention_forward`` ([B, L, H, D], keys with 8 heads), which launches the kernel.
``work`` maps rank -> factor on the rows (M) of that rank's linear and mm: other shapes, more or
less work (at the same rate unless ``slow`` says otherwise); ``grouped``: each step also runs an
``aten::_grouped_mm`` ([GM, GK] x [G, GK, GN]: each row times one group's weight) launching one
kernel."""

from __future__ import annotations

import json
from pathlib import Path

M, K, N = 4096, 8192, 8192  # the linear / addmm
B, H, L, D = 4, 32, 2048, 128  # the attention
MM = (1024, 4096, 1024)  # the aten::mm on the second thread
G, GM, GK, GN = 8, 4096, 2048, 1536  # the grouped GEMM: 4096 rows routed over 8 groups' weights
BIAS_US = 5  # the bias copy kernel of each addmm

GEMM_FLOPS = 2 * M * K * N
ATTN_FLOPS = 2 * B * H * L * L * (D + D) // 2  # causal: half
MM_FLOPS = 2 * MM[0] * MM[1] * MM[2]
GROUPED_FLOPS = 2 * GM * GK * GN  # every row meets one group's weight: not G times that


def _us(flops: float, tflops: float) -> int:
    return max(1, round(flops / (tflops * 1e12) * 1e6))


def rank_events(
    rank: int,
    *,
    steps: int,
    tflops: float,
    factor: float,
    shapes: bool,
    flash_forward: bool = False,
    work: float = 1.0,
    grouped: bool = False,
) -> list[dict]:
    ev: list[dict] = []
    corr = [rank * 100_000]
    t = [1_000_000]
    device_t = [0]  # one stream: each kernel starts after its launch and after the previous kernel

    def op(name, dur, dims, types, tid=1, concrete=None):
        args = {"External id": len(ev) + 1}
        if shapes:
            args["Input Dims"] = dims
            args["Input type"] = types
            if concrete is not None:
                args["Concrete Inputs"] = concrete
        ev.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": tid, "ts": t[0], "dur": dur, "args": args}
        )

    def launch(kernel, kdur, tid=1):
        corr[0] += 1
        c = corr[0]
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 100,
                "tid": tid,
                "ts": t[0] + 2,
                "dur": 3,
                "args": {"correlation": c, "cbid": 211},
            }
        )
        device_t[0] = max(device_t[0], t[0] + 20)
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": 7,
                "ts": device_t[0],
                "dur": kdur,
                "args": {"correlation": c, "device": 0, "stream": 7, "External id": c},
            }
        )
        device_t[0] += kdur
        t[0] += 10

    bf16 = "c10::BFloat16"
    m, mm_m = round(M * work), round(MM[0] * work)
    for _ in range(steps):
        gemm_us = round(_us(GEMM_FLOPS * m / M, tflops) * factor)
        attn_us = round(_us(ATTN_FLOPS, tflops) * factor)
        mm_us = round(_us(MM_FLOPS * mm_m / MM[0], tflops) * factor)
        start = t[0]
        op("aten::linear", 100, [[m, K], [N, K], [N]], [bf16, bf16, bf16])
        t[0] += 5
        op("aten::addmm", 80, [[N], [m, K], [K, N], [], []], [bf16, bf16, bf16, "Scalar", "Scalar"])
        launch("void at::native::elementwise_kernel<128, 2>(copy bias)", BIAS_US)
        launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", gemm_us)
        t[0] = start + 200
        op(
            "aten::_scaled_dot_product_flash_attention",
            50,
            [[B, H, L, D], [B, H, L, D], [B, H, L, D], [], [], [], []],
            [bf16, bf16, bf16, "Scalar", "Scalar", "Scalar", ""],
            concrete=["", "", "", "0.", "True", "False", ""],
        )
        if flash_forward:  # PyTorch's inner op: [B, L, H, D] layout, is_causal the 9th input; keys with 8 heads (GQA)
            t[0] += 2
            op(
                "aten::_flash_attention_forward",
                40,
                [[B, L, H, D], [B, L, 8, D], [B, L, 8, D], [], [], [], [], [], [], [], []],
                [bf16, bf16, bf16, "", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", ""],
                concrete=["", "", "", "", "", "2048", "2048", "0.", "True", "False", ""],
            )
        launch("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", attn_us)
        t[0] = start + 300
        op("aten::mm", 50, [[mm_m, MM[1]], [MM[1], MM[2]]], [bf16, bf16], tid=2)
        launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", mm_us, tid=2)
        if grouped:  # offs: the groups' row ends (an int tensor of G)
            t[0] = start + 400
            op("aten::_grouped_mm", 50, [[GM, GK], [G, GK, GN], [G]], [bf16, bf16, "int"])
            launch("cutlass_grouped_gemm_bf16_sm90", round(_us(GROUPED_FLOPS, tflops) * factor))
        t[0] = start + 1_000_000  # the next step well after this one's kernels
    return ev


def write_run(
    folder,
    *,
    ranks: int = 4,
    steps: int = 3,
    tflops: float = 500.0,
    slow: dict | None = None,
    shapes: bool = True,
    device: str | None = "NVIDIA H100 80GB HBM3",
    flash_forward: bool = False,
    work: dict | None = None,
    grouped: bool = False,
    sms: int = 132,
) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        doc: dict = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
            "record_shapes": int(shapes),
            "traceEvents": rank_events(
                r,
                steps=steps,
                tflops=tflops,
                factor=(slow or {}).get(r, 1.0),
                shapes=shapes,
                flash_forward=flash_forward,
                work=(work or {}).get(r, 1.0),
                grouped=grouped,
            ),
        }
        if device is not None:
            doc["deviceProperties"] = [{"id": 0, "name": device, "computeMajor": 9, "computeMinor": 0, "numSms": sms}]
        p = folder / f"rank{r}.pt.trace.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    return paths
