"""The settings of every command that trains, one module per command group, composed of small groups of fields.

- `fields.py`: what a settings class is made of (`setting`, `defaults`, `Settings`: fill and check once);
- `loop.py`: the training loop's groups (`LoopSettings`, `EvalSettings`, `OutputSettings`) and `TrainConfig`;
- `pretrain.py`: `pretrain` and `distill mlm` (`CorpusSettings`, `MaskingSettings`, `PretrainConfig`,
  `DistillMLMConfig`);
- `finetune.py`: `finetune classify|regress|ner|qa` and `distill TASK` (`FinetuneConfig`, `DistillConfig`) and the
  run's length (`run_length`);
- `retrieval.py`: `finetune embed|sparse|colbert|rerank`;
- `files.py`: config files, read and saved.

Each field carries its help text (`setting(default, help)`, the convention of transformers' `HfArgumentParser`);
the CLI builds its flags from these classes and a config file (JSON or YAML) is read onto the same fields, so a
default shown in `--help` is the one a run uses. This package imports no torch, so `bertforge --help` starts at
once.
"""

from .fields import Settings, defaults, flag, parse_duration, setting
from .files import cli_fields, read_config_file, saved_settings
from .finetune import DistillConfig, FinetuneConfig, check_seq_len, run_length
from .loop import EvalSettings, LoopSettings, OutputSettings, TrainConfig
from .pretrain import OBJECTIVES, CorpusSettings, DistillMLMConfig, MaskingSettings, PretrainConfig
from .retrieval import ColbertConfig, EmbedConfig, RerankConfig, SparseConfig

__all__ = ["OBJECTIVES", "ColbertConfig", "CorpusSettings", "DistillConfig", "DistillMLMConfig", "EmbedConfig",
           "EvalSettings", "FinetuneConfig", "LoopSettings", "MaskingSettings", "OutputSettings", "PretrainConfig",
           "RerankConfig", "Settings", "SparseConfig", "TrainConfig", "check_seq_len", "cli_fields", "defaults",
           "flag", "parse_duration", "read_config_file", "run_length", "saved_settings", "setting"]
