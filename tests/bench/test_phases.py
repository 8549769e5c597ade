"""bench.phases: a profiled op's phase from its JAX name stack, and the table of a step's phases."""

from __future__ import annotations

import pytest

from bench import phases

STEP = "jit(step_fn)/while/body/closed_call"
SPLASH_TEXT = (
    "%splash_mqa_dkv_segmented_no_residuals.24 = (f32[32,1024,128]{2,1,0:T(8,128)}, bf16[16]) "
    'custom-call(s8[1,16,16]{2,1,0} %copy-done.201), custom_call_target="tpu_custom_call"'
)
COND_TEXT = "%cond.77 = (f32[32768,4096]{1,0:T(8,128)}, s32[]) conditional(s32[]{:T(128)} %convert.3, (f32[2]) %t)"


@pytest.mark.parametrize(
    ("stack", "event", "phase"),
    [
        (f"{STEP}/jvp(Transformer)/while/body/closed_call/Block/mlp/btd,df->btf/dot_general", "", "layer matmuls fwd"),
        (
            f"{STEP}/transpose(jvp(Transformer))/while/body/closed_call/checkpoint/Block/mlp/btd,df->btf/dot_general",
            "",
            "layer matmuls bwd",
        ),
        (f"{STEP}/jvp(Transformer)/while/body/closed_call/Block/attn/q_norm/mul", "", "other layer ops fwd"),
        (f"{STEP}/transpose(jvp(Transformer))/final_norm/add_any", "", "other layer ops bwd"),
        (f"{STEP}/jvp(Transformer)/Block/attn/attention_core/bqkgd,bskd->bkgqs/dot_general", "", "attention fwd"),
        (f"{STEP}/transpose(jvp(Transformer))/Block/attn/attention_core/exp", "", "attention bwd"),
        ("", "splash_mqa_fwd_segmented_residuals.41", "attention fwd"),
        ("", "splash_mqa_dkv_segmented_no_residuals.24", "attention bwd"),
        (f"{STEP}/jvp(lm_head_loss)/while/body/closed_call/btd,dv->btv/dot_general", "", "LM head + loss"),
        (f"{STEP}/transpose(jvp(lm_head_loss))/exp", "", "LM head + loss bwd"),
        (f"{STEP}/grad_accumulate/add", "", "gradient accumulation"),
        ("jit(step_fn)/optimizer_update/mul", "", "optimizer update"),
        ("jit(step_fn)/optimizer_update/transpose(x)/dot_general", "", "optimizer update"),  # the scope wins
        (f"{STEP}/jvp(Transformer)/embed/jit(_take)/gather", "", "embedding"),
        ("jit(step_fn)/broadcast_in_dim", "", "other"),
    ],
)
def test_an_ops_phase_comes_from_its_name_stack(stack, event, phase):
    assert phases.phase_of(stack, event) == phase


def test_trace_events_name_their_instruction_and_containers_are_not_counted():
    assert phases.event_op(SPLASH_TEXT) == ("splash_mqa_dkv_segmented_no_residuals.24", False)
    assert phases.event_op(COND_TEXT) == ("cond.77", True)
    assert phases.event_op("%while.265 = (s32[]{:T(128)}, f32[4]) while((s32[], f32[4]) %tuple.1)")[1]
    assert phases.event_op("fusion.12") == ("fusion.12", False)  # a CPU trace: the name alone


def test_the_compiled_steps_text_maps_instructions_to_their_stacks():
    hlo = (
        '  %fusion.3 = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%c, metadata={op_name="jit(step_fn)/'
        'optimizer_update/add" stack_frame_id=3}\n'
        '  ROOT %tuple.9 = (f32[8]) tuple(%fusion.3), metadata={op_name="jit(step_fn)/grad_accumulate/add"}\n'
        "  %param.1 = f32[8]{0} parameter(0)\n"
    )
    assert phases.hlo_op_names(hlo) == {
        "fusion.3": "jit(step_fn)/optimizer_update/add",
        "tuple.9": "jit(step_fn)/grad_accumulate/add",
    }


def test_the_table_sums_each_phase_per_step_and_the_host_gap_is_the_idle_wall_time():
    names = {"fusion.1": "jit(step_fn)/optimizer_update/add", "fusion.2": "jit(step_fn)/grad_accumulate/add"}
    events = [
        ("%fusion.1 = f32[8] fusion(%p)", 4e6, ""),
        ("fusion.2", 2e6, ""),
        ("fusion.2", 2e6, ""),
        (COND_TEXT, 100e6, ""),  # holds the others: not counted
        ("copy.7", 2e6, ""),  # no stack: other
    ]
    rows = {r["phase"]: r for r in phases.phase_table(events, names, steps=2, wall_ns=24e6, busy_ns=10e6)}
    assert rows["optimizer update"]["ms_per_step"] == 2.0
    assert rows["gradient accumulation"]["ms_per_step"] == 2.0
    assert rows["other"]["ms_per_step"] == 1.0
    assert rows[phases.HOST_GAP]["ms_per_step"] == 7.0  # (24 - 10) ms over 2 steps
    assert rows["optimizer update"]["share"] == pytest.approx(2 / 12)
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    assert "| optimizer update | 2.0 | 16.7% |" in phases.format_table(list(rows.values()))
