"""Configuration: the YAML contract, validated once at load with errors that name their key."""

from .compile import retry_policy, throttle_spec
from .effective import effective, effective_yaml
from .loader import ConfigError, load_dict, load_file, load_text
from .presets import PRESETS
from .schema import (
    PROTOCOL_PRESETS,
    Config,
    GrpcListenerConfig,
    HttpListenerConfig,
    ListenerConfig,
    MongoListenerConfig,
    PolicyConfig,
    UpstreamConfig,
)

__all__ = [
    "PRESETS",
    "PROTOCOL_PRESETS",
    "Config",
    "ConfigError",
    "GrpcListenerConfig",
    "HttpListenerConfig",
    "ListenerConfig",
    "MongoListenerConfig",
    "PolicyConfig",
    "UpstreamConfig",
    "effective",
    "effective_yaml",
    "load_dict",
    "load_file",
    "load_text",
    "retry_policy",
    "throttle_spec",
]
