"""FLOPs / bytes rules, checked against hand-computed values."""

from __future__ import annotations

import pytest

from ets_hook.ets.flops import (
    OpCost,
    backward_factors,
    conv_output_size,
    dtype_size_bytes,
    einsum_cost,
    op_cost,
)

F3 = ["float", "float", "float"]


def test_linear_hand_computed() -> None:
    # y[32,128] = x[32,64] @ w[128,64]^T + b[128]
    cost = op_cost("aten::linear", [[32, 64], [128, 64], [128]], F3)
    assert cost.flops == 2 * 32 * 64 * 128 + 32 * 128  # MACs x2 + bias adds = 528,384
    assert cost.bytes_moved == (32 * 64 + 128 * 64 + 128 + 32 * 128) * 4  # 57,856
    assert cost.known


def test_linear_without_bias_and_batched_input() -> None:
    no_bias = op_cost("aten::linear", [[32, 64], [128, 64], []], ["float", "float", ""])
    assert no_bias.flops == 2 * 32 * 64 * 128
    assert no_bias.bytes_moved == (32 * 64 + 128 * 64 + 32 * 128) * 4
    batched = op_cost("aten::linear", [[4, 8, 64], [16, 64], [16]], F3)
    assert batched.flops == 2 * 32 * 64 * 16 + 32 * 16


def test_linear_half_precision_bytes() -> None:
    cost = op_cost("aten::linear", [[32, 64], [128, 64], [128]], ["c10::Half"] * 3)
    assert cost.bytes_moved == (32 * 64 + 128 * 64 + 128 + 32 * 128) * 2


def test_addmm_mm_bmm_matmul() -> None:
    addmm = op_cost("aten::addmm", [[128], [32, 64], [64, 128], [], []], [*F3, "Scalar", "Scalar"])
    assert addmm.flops == 2 * 32 * 64 * 128 + 32 * 128
    assert op_cost("aten::mm", [[32, 64], [64, 128]], F3[:2]).flops == 2 * 32 * 64 * 128
    bmm = op_cost("aten::bmm", [[8, 16, 32], [8, 32, 4]], F3[:2])
    assert bmm.flops == 2 * 8 * 16 * 32 * 4
    assert bmm.bytes_moved == (8 * 16 * 32 + 8 * 32 * 4 + 8 * 16 * 4) * 4
    # matmul broadcasts batch dims: [2,1,5,6] @ [3,6,7] -> [2,3,5,7]
    mm = op_cost("aten::matmul", [[2, 1, 5, 6], [3, 6, 7]], F3[:2])
    assert mm.flops == 2 * 6 * 5 * 6 * 7
    assert op_cost("aten::matmul", [[6], [6]], F3[:2]).flops == 12  # dot product
    baddbmm = op_cost("aten::baddbmm", [[8, 16, 4], [8, 16, 32], [8, 32, 4]], F3)
    assert baddbmm.flops == 2 * 8 * 16 * 32 * 4 + 8 * 16 * 4


def test_conv2d_hand_computed_with_concrete_inputs() -> None:
    # x[4,3,16,16] * w[8,3,3,3] + b[8], stride 2, padding 1 -> out [4,8,8,8]
    shapes = [[4, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], []]
    dtypes = [*F3, "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    concrete = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]
    cost = op_cost("aten::conv2d", shapes, dtypes, concrete_inputs=concrete)
    out = 4 * 8 * 8 * 8
    assert cost.flops == 2 * out * 3 * 3 * 3 + out  # 110,592 + 2,048 bias = 112,640
    assert cost.bytes_moved == (4 * 3 * 16 * 16 + 8 * 3 * 3 * 3 + 8 + out) * 4  # 21,376


def test_conv2d_without_parameters_assumes_same_padding_stride_1() -> None:
    shapes = [[4, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], []]
    cost = op_cost(
        "aten::conv2d", shapes, [*F3, "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    )
    out = 4 * 8 * 16 * 16
    assert cost.flops == 2 * out * 27 + out


def test_conv2d_matches_the_ets_artifact_convention() -> None:
    # AlexNet conv1 at 64x64, batch 2: x[2,3,64,64] * w[64,3,11,11], stride 4, padding 2 -> 15x15.
    # The artifact's flops column counts 2*N*K*P*Q*C*R*S without bias: 20,908,800.
    shapes = [[2, 3, 64, 64], [64, 3, 11, 11], [], [], [], [], []]
    dtypes = ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    cost = op_cost("conv2d", shapes, dtypes, concrete_inputs=["", "", "", "[4]", "[2]", "[1]", "1"])
    assert cost.flops == 2 * 2 * 64 * 15 * 15 * 3 * 11 * 11 == 20_908_800


def test_grouped_and_strided_convolutions() -> None:
    # depthwise: 16 groups of one channel, no bias, stride 1 same padding
    dw = op_cost("aten::conv2d", [[2, 16, 8, 8], [16, 1, 3, 3], []], ["float", "float", ""])
    assert dw.flops == 2 * 2 * 16 * 8 * 8 * 1 * 9
    # aten::convolution has groups at position 8
    conv = op_cost(
        "aten::convolution",
        [[1, 4, 10], [6, 2, 3], [6], [], [], [], [], [], []],
        [*F3, "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"],
        concrete_inputs=["", "", "", "[2]", "[0]", "[1]", "False", "[0]", "2"],
    )
    p = conv_output_size(10, 3, stride=2, padding=0)  # 4
    assert conv.flops == 2 * 1 * 6 * p * 2 * 3 + 6 * p
    conv3d = op_cost("aten::conv3d", [[1, 2, 4, 4, 4], [3, 2, 1, 1, 1], []], ["float", "float", ""])
    assert conv3d.flops == 2 * 3 * 64 * 2


def test_convolution_backward_kernel_is_twice_forward() -> None:
    cost = op_cost(
        "aten::convolution_backward",
        [[4, 8, 8, 8], [4, 3, 16, 16], [8, 3, 3, 3]],
        F3,
    )
    assert cost.flops == 2 * (2 * 4 * 8 * 8 * 8 * 3 * 3 * 3)


def test_backward_nodes_scale_the_forward_cost() -> None:
    fwd = op_cost("aten::addmm", [[128], [32, 64], [64, 128]], F3)
    bwd = op_cost(
        "autograd::engine::evaluate_function: AddmmBackward0", [[128], [32, 64], [64, 128]], F3
    )
    assert bwd.flops == 2 * fwd.flops
    assert backward_factors("relu") == (1.0, 1.5)
    relu_bwd = op_cost("ReluBackward0", [[10, 10]], ["float"])
    assert relu_bwd.flops == 100


def test_pooling_norm_softmax_embedding_elementwise() -> None:
    pool = op_cost(
        "aten::max_pool2d",
        [[4, 8, 8, 8], [], [], [], [], []],
        ["float", "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
        concrete_inputs=["", "[2, 2]", "[2, 2]", "[0, 0]", "[1, 1]", "False"],
    )
    assert pool.flops == 4 * 8 * 4 * 4 * 4  # 4 compares per output element
    assert pool.bytes_moved == (4 * 8 * 8 * 8 + 4 * 8 * 4 * 4) * 4
    adaptive = op_cost("aten::adaptive_avg_pool2d", [[2, 16, 7, 7], []], ["float", "ScalarList"])
    assert adaptive.bytes_moved == (2 * 16 * 49 + 2 * 16) * 4
    bn = op_cost("aten::batch_norm", [[4, 8, 8, 8], [8], [8], [8], [8]], ["float"] * 5)
    assert bn.flops == 7 * 2048
    assert bn.bytes_moved == (2 * 2048 + 4 * 8) * 4
    ln = op_cost(
        "aten::layer_norm", [[4, 10, 32], [], [32], [32]], ["float", "ScalarList", "float", "float"]
    )
    assert ln.flops == 7 * 4 * 10 * 32
    sm = op_cost("aten::softmax", [[4, 10], [], []], ["float", "Scalar", "Scalar"])
    assert sm == OpCost(5 * 40, 2 * 40 * 4)
    emb = op_cost("aten::embedding", [[1000, 16], [4, 7]], ["float", "long int"])
    assert emb == OpCost(0, 4 * 7 * 8 + 2 * 28 * 16 * 4)
    relu = op_cost("aten::relu", [[4, 8]], ["float"])
    assert relu == OpCost(32, 2 * 32 * 4)
    add = op_cost("aten::add", [[4, 8], [8], []], ["float", "float", "Scalar"])
    assert add == OpCost(32, (32 + 8 + 32) * 4)  # broadcast output [4, 8]
    inplace = op_cost("aten::add_", [[4, 8], [4, 8], []], ["float", "float", "Scalar"])
    assert inplace.flops == 32
    assert op_cost("aten::view", [[4, 8], []], ["float", "ScalarList"]) == OpCost(0, 0)


def test_attention_and_einsum() -> None:
    q = [2, 4, 16, 8]  # batch 2, 4 heads, 16 queries, head dim 8
    sdpa = op_cost("aten::scaled_dot_product_attention", [q, q, q], F3)
    scores = 2 * 4 * 16 * 16
    assert sdpa.flops == 2 * scores * 8 * 2 + 5 * scores
    assert sdpa.bytes_moved == 4 * (2 * 4 * 16 * 8) * 4
    ein = op_cost(
        "aten::einsum",
        [[], [2, 3, 4], [2, 4, 5]],
        ["", "float", "float"],
        concrete_inputs=["bij,bjk->bik", "", ""],
    )
    assert ein.flops == 2 * 2 * 3 * 4 * 5
    assert einsum_cost("ij,jk", [[3, 4], [4, 5]]).flops == 2 * 3 * 4 * 5
    assert einsum_cost("...ij,...jk->...ik", [[7, 3, 4], [7, 4, 5]]).flops == 2 * 7 * 3 * 4 * 5
    with pytest.raises(ValueError, match="operands"):
        einsum_cost("ij,jk->ik", [[3, 4]])
    # without the equation the op is costed conservatively, not guessed
    assert not op_cost("aten::einsum", [[], [2, 3], [3, 4]], ["", "float", "float"]).known


def test_unknown_and_shapeless_ops_never_raise() -> None:
    unknown = op_cost("aten::my_custom_op", [[2, 3]], ["float"])
    assert unknown == OpCost(0, 2 * 6 * 4, known=False)
    assert op_cost("aten::relu", [], []) == OpCost(0, 0, known=False)
    assert op_cost("aten::linear", [[2, 3]], ["float"]).known is False  # weight missing
    assert op_cost("aten::conv2d", [[2, 3, 4, 4], [5]], ["float", "float"]).known is False
    with pytest.raises(ValueError, match="negative"):
        op_cost("aten::relu", [[-1, 3]], ["float"])


def test_dtype_sizes_and_bad_conv_arguments() -> None:
    assert dtype_size_bytes("c10::BFloat16") == 2
    assert dtype_size_bytes("long int") == 8
    assert dtype_size_bytes("torch.float64") == 8
    with pytest.raises(ValueError, match="stride"):
        conv_output_size(8, 3, stride=0)
