"""OLMo 3 in Flax: configs, init/forward, accounting, sharding rules, HF conversion.

Imports nothing from the rest of the project (``pipelines``, ``dataloader``, ``trainer``); within
the package: config → partitioning (leaf) → attention → layers → transformer → sharding / accounting / hf.
"""

from model import attention
from model.axis_rules import MESH_AXES, ShardingConfig
from model.config import FULL, NAMED_CONFIGS, SLIDING, ModelConfig, default_layer_types, get_config
from model.flops import count_params, flops_per_token, matmul_params
from model.hf import load_hf, save_hf
from model.param_sharding import check_divisible, logical_param_axes, param_partition_specs, param_shardings
from model.transformer import abstract_params, final_hidden, forward, init, lm_head

__all__ = [
    "FULL",
    "MESH_AXES",
    "attention",
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
