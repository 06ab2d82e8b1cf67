"""The pure ML library of rofu: reward networks, the ROFU estimator, baseline policies,
training and checkpoints. It reads no files, databases or environment variables.

A reward network is any `RewardModel` (`rofu.models.reward_model`): the MLP `RewardNet`, the
`ConvRewardNet` or the CIFAR `ResNet` on images, or a plain module wrapped by
`PerArmModel` / `PairModel`.

Tensor dimension letters, used in shape comments and docstrings throughout:

    B  requests (contexts scored together)
    A  arms (candidate actions)
    D  context features (a context of another shape, an image, is (*context_shape))
    F  arm features (arm-feature networks only)
    H  hidden units
    P  parameters of a network (flattened), or (context, arm) pairs in ROFU
    N  data points (logged transitions)
    K  candidate arms of one request
    M  ROFU gradient-ascent steps
"""

from rofu.models.checkpoint import Checkpoint, CheckpointError, dump_checkpoint, load_checkpoint
from rofu.models.convnet import ConvRewardNet, ConvRewardNetConfig
from rofu.models.data import DataBuffer, RegulariserData, Transitions
from rofu.models.networks import RewardNet, RewardNetConfig
from rofu.models.resnet import ResNet, ResNetConfig
from rofu.models.reward_model import PairModel, PerArmModel, RewardModel, RewardModelConfig
from rofu.models.rofu import RofuConfig, rofu_scores
from rofu.models.scores import Decision, Scores
from rofu.models.training import FitConfig, fit

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "ConvRewardNet",
    "ConvRewardNetConfig",
    "DataBuffer",
    "Decision",
    "FitConfig",
    "PairModel",
    "PerArmModel",
    "RegulariserData",
    "ResNet",
    "ResNetConfig",
    "RewardModel",
    "RewardModelConfig",
    "RewardNet",
    "RewardNetConfig",
    "RofuConfig",
    "Scores",
    "Transitions",
    "dump_checkpoint",
    "fit",
    "load_checkpoint",
    "rofu_scores",
]
