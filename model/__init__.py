"""OLMo 3 in Flax: configs, init/forward, accounting, sharding rules, HF conversion.

Imports nothing from the rest of the project (``pipelines``, ``dataloader``, ``trainer``); within
the package: config → partitioning (leaf) → attention → context_parallel → layers → transformer → sharding / accounting / hf.
"""

from model import attention, context_parallel
from model.axis_rules import CONTEXT, CONTEXT_MESH_AXES, MESH_AXES, ShardingConfig
from model.config import FULL, NAMED_CONFIGS, SLIDING, ModelConfig, default_layer_types, get_config
from model.flops import count_params, flops_per_token, matmul_params
from model.hf import load_hf, save_hf
from model.param_sharding import check_divisible, logical_param_axes, param_partition_specs, param_shardings
from model.transformer import abstract_params, final_hidden, forward, init, lm_head

__all__ = [
    "CONTEXT",
    "CONTEXT_MESH_AXES",
    "FULL",
    "MESH_AXES",
    "attention",
    "context_parallel",
    "NAMED_CONFIGS",
    "SLIDING",
    "ModelConfig",
    "ShardingConfig",
    "abstract_params",
    "check_divisible",
    "count_params",
    "default_layer_types",
    "final_hidden",
    "flops_per_token",
    "forward",
    "get_config",
    "init",
    "lm_head",
    "load_hf",
    "logical_param_axes",
    "matmul_params",
    "param_partition_specs",
    "param_shardings",
    "save_hf",
]
