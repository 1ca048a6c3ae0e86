"""The policy file: schema, validation with clear errors, compilation to the core's rules."""

from gpushepherd.policy.load import (
    STANDARD_CLASSES,
    Policy,
    PolicyError,
    load_policy,
    override_cluster,
    parse_policy,
    policy_from_dict,
    read_policy_dict,
)

__all__ = ["STANDARD_CLASSES", "Policy", "PolicyError", "load_policy", "override_cluster", "parse_policy",
           "policy_from_dict", "read_policy_dict"]
