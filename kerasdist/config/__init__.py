"""Recipe configuration: typed frozen models, YAML loading, ``--set`` overrides, JSON Schema."""

from kerasdist.config.loader import (
    apply_overrides,
    dump_recipe,
    json_schema,
    load_recipe,
    validate_recipe,
)
from kerasdist.config.schema import (
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    DefaultStrategyConfig,
    MirroredStrategyConfig,
    ModelConfig,
    MultiWorkerStrategyConfig,
    OptimizerConfig,
    OutputConfig,
    ParameterServerStrategyConfig,
    Recipe,
    TrainerConfig,
)

__all__ = [
    "CheckpointConfig", "ClusterConfig", "DataConfig", "DefaultStrategyConfig",
    "MirroredStrategyConfig", "ModelConfig", "MultiWorkerStrategyConfig",
    "ParameterServerStrategyConfig", "OptimizerConfig", "OutputConfig", "Recipe",
    "TrainerConfig", "apply_overrides", "dump_recipe", "json_schema", "load_recipe",
    "validate_recipe",
]
