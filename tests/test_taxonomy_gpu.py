"""The built-in taxonomy on real MoE names of GPU stacks, family by family.

Names are written as they appear in public code and traces: demangled CUDA/HIP kernel symbols
(what Kineto writes for a kernel), custom-op names (cpu_op), nn.Module ranges (with_modules) and
python frames "path.py(line): func" (with_stack). Each family has negatives (dense GEMMs,
attention, bookkeeping frames of the same package) that must stay unclassified.
"""

from __future__ import annotations

import pytest

from slowcard import store

NONE = None

FAMILIES = {
    "vllm": [
        ("fused_moe_kernel", "grouped_matmul"),
        ("fused_moe_kernel_gptq_awq", "grouped_matmul"),
        ("vllm::moe_forward", "moe_layer"),
        ("vllm::moe_forward_shared", "moe_layer"),
        ("nn.Module: FusedMoE_0", "moe_layer"),
        ("vllm::outplace_fused_experts", "grouped_matmul"),
        ("_moe_C::moe_wna16_marlin_gemm", "grouped_matmul"),
        (
            "void marlin_moe_wna16::Marlin<(vllm::ScalarTypeId)5, 256, 1, 8, 8, 4, false, 8>(int4 const*, int4 const*, int4*)",
            "grouped_matmul",
        ),
        ("_C::cutlass_moe_mm", "grouped_matmul"),
        ("_moe_C::topk_softmax", "gating"),
        (
            "void vllm::moe::topkGatingSoftmax<8, 128, 4, 16, int>(float const*, bool const*, float*, int, int*, int*, int, int, int)",
            "gating",
        ),
        ("void vllm::moe::moeSoftmax<256>(float const*, bool const*, float*, int)", "gating"),
        ("_moe_C::moe_align_block_size", "gating"),
        (
            "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*)",
            "gating",
        ),
        ("void vllm::moe::count_and_sort_expert_tokens_kernel<long>(long const*, int*, int*, unsigned long)", "gating"),
        ("void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*, c10::BFloat16 const*, int)", "gating"),
        ("vllm/model_executor/layers/fused_moe/fused_moe.py(1337): fused_experts_impl", "grouped_matmul"),
        # the real vLLM decode trace of gpt-oss on ROCm (TraceLens test data)
        (
            "vllm/model_executor/layers/fused_moe/gpt_oss_triton_kernels_moe.py(269): triton_kernel_fused_experts",
            "grouped_matmul",
        ),
        ("triton_kernels/matmul_ogs.py(352): matmul_ogs", "grouped_matmul"),
        ("triton_kernels/routing.py(292): routing", "gating"),
        ("vllm/model_executor/layers/fused_moe/gpt_oss_triton_kernels_moe.py(145): legacy_routing", "gating"),
        # modular kernel prepare/finalize and the all2all managers
        ("vllm/model_executor/layers/fused_moe/deepep_ht_prepare_finalize.py(160): prepare", "dispatch"),
        ("vllm/model_executor/layers/fused_moe/pplx_prepare_finalize.py(250): finalize", "combine"),
        ("vllm/distributed/device_communicators/all2all.py(80): dispatch", "dispatch"),
        ("vllm/distributed/device_communicators/all2all.py(95): combine", "combine"),
        # negatives from the same trace
        ("triton_poi_fused_constant_pad_nd_moe_forward_0", NONE),
        ("vllm/model_executor/layers/fused_moe/runner/default_moe_runner.py(76): _moe_forward", NONE),
        ("vllm/model_executor/layers/fused_moe/config.py(944): use_all2all_kernels", NONE),
        ("vllm::rocm_unquantized_gemm", NONE),
        ("vllm::unified_attention_with_output", NONE),
        (
            "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>, false>(Flash_fwd_params)",
            NONE,
        ),
    ],
    "sglang": [
        ("grouped_gemm_triton_kernel", "grouped_matmul"),
        ("pre_reorder_triton_kernel", "gating"),
        ("post_reorder_triton_kernel", "gating"),
        ("compute_seg_indptr_triton_kernel", "gating"),
        ("deepep_permute_triton_kernel", "gating"),
        (
            "void moe_fused_gate_kernel<float, 256, 8, 4, 32>(void*, void*, float*, int*, long, long, long, long)",
            "gating",
        ),
        ("nn.Module: DeepEPMoE_3", "moe_layer"),
        ("nn.Module: EPMoE_0", "moe_layer"),
        ("sglang/srt/layers/moe/token_dispatcher/deepep.py(512): dispatch_a", "dispatch"),
        ("sglang/srt/layers/moe/token_dispatcher/deepep.py(560): combine_b", "combine"),
        ("sglang/srt/layers/attention/flashinfer_backend.py(400): forward_decode", NONE),
        ("nn.Module: RadixAttention_0", NONE),
    ],
    "deepep": [
        (
            "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, int, int, int, void**, int, int, int)",
            "dispatch",
        ),
        (
            "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int, bool const*, int*, int*, int, int, void**, int**, int)",
            "dispatch",
        ),
        (
            "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, __nv_bfloat16 const*, float const*, int const*, int const*, int const*, int, int, int, int, void**, int, int, int)",
            "combine",
        ),
        ("void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int)", "combine"),
        (
            "void deep_ep::internode::dispatch<false, 2, 8, 2, 3, 4, 1>(int4*, float*, long*, float*, SourceMeta*, int4 const*)",
            "dispatch",
        ),
        (
            "void deep_ep::internode::notify_dispatch<false, 2>(int const*, int*, int, int const*, int*, int)",
            "dispatch",
        ),
        (
            "void deep_ep::internode::combine<false, 2, 8, 2, 3, 4, 1>(int4*, float*, bool const*, int4 const*)",
            "combine",
        ),
        ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*, long*, int*, int*)", "dispatch"),
        ("void deep_ep::internode_ll::combine<3, 7168, 128>(void*, void*, int*, void*, long const*)", "combine"),
        (
            "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
            "gating",
        ),
        ("void uccl::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*)", "dispatch"),
        ("void primus_turbo::deep_ep::internode::combine<false, 2, 8>(int4*, float*)", "combine"),
        ("deep_ep/buffer.py(640): low_latency_dispatch", "dispatch"),
        ("deep_ep/buffer.py(700): combine", "combine"),
        ("deep_ep/buffer.py(130): get_dispatch_config", NONE),
        ("void deep_ep::intranode::barrier<8>(int**, int)", NONE),
    ],
    "deepgemm": [
        (
            "void deep_gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 128u, 128u, 8u, 6u, 1u, 1u, (deep_gemm::GemmType)1>(__nv_bfloat16*, float*, int*, unsigned int)",
            "grouped_matmul",
        ),
        (
            "void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 128u, 128u, 128u, 8u, 5u, 2u, 1u, true, (deep_gemm::GemmType)2>(float*, int*, unsigned int)",
            "grouped_matmul",
        ),
        ("deep_gemm::Gemm<4096, 7168, 128, 128, 128, 8, 6, 1, GemmType::GroupedContiguous>", "grouped_matmul"),
        ("m_grouped_fp8_gemm_nt_masked", "grouped_matmul"),
        ("deep_gemm/jit_kernels/m_grouped_gemm.py(20): m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", "grouped_matmul"),
        (
            "void deep_gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 128u, 128u, 1u, 6u, 1u, 1u, (deep_gemm::GemmType)0>(__nv_bfloat16*, float*, int*, unsigned int)",
            NONE,
        ),
    ],
    "cutlass_cublas_grouped": [
        (
            "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<cutlass::gemm::threadblock::MmaMultistage<>, true> >(cutlass::gemm::kernel::GemmGrouped<>::Params)",
            "grouped_matmul",
        ),
        (
            "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, cutlass::gemm::collective::CollectiveMma<> > >(cutlass::gemm::kernel::GemmUniversal<>::Params)",
            "grouped_matmul",
        ),
        ("aten::_grouped_mm", "grouped_matmul"),
        ("aten::_scaled_grouped_mm", "grouped_matmul"),
        ("grouped_gemm::GroupedGemm", "grouped_matmul"),
        (
            "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, cutlass::gemm::collective::CollectiveMma<> > >(cutlass::gemm::kernel::GemmUniversal<>::Params)",
            NONE,
        ),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
            NONE,
        ),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", NONE),
        ("aten::mm", NONE),
    ],
    "aiter_ck": [
        ("aiter::moe_sorting_fwd", "gating"),
        (
            "void ck_tile::kentry<256, 1, ck_tile::MoeSortingKernel<ck_tile::MoeSortingProblemEx<int, float, 1, true, false, true, 0> > >(ck_tile::MoeSortingKernel<>::Kargs)",
            "gating",
        ),
        ("aiter::fmoe_g1u1", "grouped_matmul"),
        ("aiter::ck_moe_stage1", "grouped_matmul"),
        ("fmoe_bf16_pertokenFp8_g1u1_vs_silu_1tg_ps_32x256", "grouped_matmul"),
        (
            "void ck::kernel_moe_gemm<ck::GridwiseMoeGemm<ck::tensor_layout::gemm::RowMajor>, true, 2>(ck::GridwiseMoeGemm<>::Argument)",
            "grouped_matmul",
        ),
        ("vllm::rocm_aiter_fused_moe", "grouped_matmul"),
        ("vllm::rocm_aiter_topk_softmax", "gating"),
        ("aiter::rmsnorm2d_fwd_with_add_ck", NONE),
        ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1_SN_1LDSB1_GRVW8", NONE),
        (
            "void ck_tile::kentry<256, 1, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<> > >(ck_tile::FmhaFwdKernel<>::Kargs)",
            NONE,
        ),
    ],
    "megatron_te": [
        ("nn.Module: MoELayer_0", "moe_layer"),
        ("nn.Module: TopKRouter_0", "gating"),
        ("nn.Module: TEGroupedMLP_0", "grouped_matmul"),
        ("nn.Module: SequentialMLP_2", "grouped_matmul"),
        ("megatron/core/transformer/moe/token_dispatcher.py(611): token_dispatch", "dispatch"),
        ("megatron/core/transformer/moe/token_dispatcher.py(650): token_combine", "combine"),
        ("megatron/core/transformer/moe/token_dispatcher.py(300): token_permutation", "dispatch"),
        ("megatron/core/transformer/moe/fused_a2a.py(120): fused_dispatch", "dispatch"),
        ("megatron/core/transformer/moe/fused_a2a.py(180): fused_combine", "combine"),
        ("transformer_engine/pytorch/cpp_extensions/gemm.py(200): general_grouped_gemm", "grouped_matmul"),
        ("void transformer_engine::moe_permute_row_map(int const*, int*, int, int, int)", "gating"),
        (
            "void moe_unpermute_kernel<__nv_bfloat16, float, true>(__nv_bfloat16 const*, __nv_bfloat16*, int*, float*, int, int, int)",
            "gating",
        ),
        ("megatron/core/transformer/moe/router.py(400): routing", "gating"),
        ("nn.Module: TELayerNormColumnParallelLinear_0", NONE),
        ("megatron/core/transformer/attention.py(300): forward", NONE),
        ("nn.Module: DotProductAttention_0", NONE),
    ],
    "annotations": [  # record_function names of a hand-instrumented EP training loop
        ("dispatch(F)", "dispatch"),
        ("combine(B)", "combine"),
        ("mlp(F)", "grouped_matmul"),
        ("mlp", NONE),
        ("dispatcher_init", NONE),
    ],
    "torch_nccl": [
        ("nccl:all_to_all", "collective"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "collective"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "collective"),
    ],
    "ascend": [
        ("aclnnGroupedMatmulV5", "grouped_matmul"),
        ("MoeDistributeDispatchV2", "dispatch"),
        ("MoeDistributeCombine", "combine"),
        ("MoeGatingTopKSoftmax", "gating"),
        ("hcom_alltoall_", "collective"),
        ("MatMulV2", NONE),
    ],
}


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    c = store.open_db(tmp_path_factory.mktemp("tax") / "t.duckdb")
    yield c
    c.close()


def classify(con, names):
    rows = con.execute("SELECT name, op_class FROM _classify_names(?)", [names]).fetchall()
    return dict(rows)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_names_classified(con, family):
    cases = FAMILIES[family]
    got = classify(con, [n for n, _ in cases])
    wrong = [(n, want, got[n]) for n, want in cases if got[n] != want]
    assert not wrong, wrong


def test_user_row_overrides_a_builtin(con, tmp_path):
    """--taxonomy rows win over built-ins: a site can re-class a kernel the built-ins got wrong."""
    from slowcard.store import load_user_taxonomy

    db = tmp_path / "u.duckdb"
    c = store.open_db(db)
    try:
        name = "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int)"
        assert classify(c, [name])[name] == "combine"
        f = tmp_path / "tax.csv"
        f.write_text(
            "pattern,op_class,coll_kind,priority\ncached_notify_combine,gating,,99\n^my_expert_gemm,grouped_matmul,,1\n"
        )
        assert load_user_taxonomy(c, f) == 2
        got = classify(c, [name, "my_expert_gemm_v2"])
        assert got == {name: "gating", "my_expert_gemm_v2": "grouped_matmul"}
    finally:
        c.close()


def test_ingest_classifies_like_the_full_rule(tmp_path):
    """Ingest matches names through one prefilter regex of all built-in patterns (speed); it must
    give what the plain name x pattern join gives, and a user row INSERTed by hand still counts."""
    import json

    from slowcard.ingest import ingest_paths
    from slowcard.store import rebuild_derived

    names = sorted({n for cases in FAMILIES.values() for n, _ in cases} | {"my_stack::expert_gemm"})
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0, "args": {}}
        for i, n in enumerate(names)
    ]
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "rank0.json").write_text(json.dumps({"traceEvents": ev, "distributedInfo": {"rank": 0}}))
    db = tmp_path / "c.duckdb"
    ingest_paths(db, [tmp_path / "t"], run="r")
    c = store.open_db(db)
    try:
        want = {n: cls for n, cls in classify(c, names).items() if cls is not None}
        got = dict(c.execute("SELECT name, op_class FROM op_classes").fetchall())
        assert got == want
        assert "my_stack::expert_gemm" not in got
        c.execute("INSERT INTO op_taxonomy VALUES ('^my_stack::expert_gemm$', 'grouped_matmul', NULL, 1, 'user')")
        rebuild_derived(c)
        got = dict(c.execute("SELECT name, op_class FROM op_classes").fetchall())
        assert got["my_stack::expert_gemm"] == "grouped_matmul"
    finally:
        c.close()
