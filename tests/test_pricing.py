"""The policy's price table (note 010): optional, every GPU type priced, clear errors."""

import pytest

from gpushepherd.policy import PolicyError, policy_from_dict

CLUSTER = {"nodes": [{"name": "h", "gpus": 4, "gpu_type": "H100-80GB"}, {"name": "a", "gpus": 2, "gpu_type": "A100"}]}


def _rules(pricing):
    return policy_from_dict({"cluster": CLUSTER, "pricing": pricing}, "p.yaml").rules


def test_prices_by_gpu_type_with_a_default():
    p = _rules({"currency": "USD", "gpu_hour": {"H100-80GB": 2.5, "default": 1}}).pricing
    assert p.currency == "USD"
    assert p.price("H100-80GB") == 2.5 and p.price("A100") == 1.0


def test_no_pricing_is_none():
    assert policy_from_dict({"cluster": CLUSTER}).rules.pricing is None


@pytest.mark.parametrize("pricing, fragment", [
    ({"gpu_hour": {"H200": 3.0, "default": 1.0}}, "pricing.gpu_hour.H200: 'H200' is not allowed: a GPU type of the "
                                                  "cluster (A100, H100-80GB) or default"),
    ({"gpu_hour": {"H100-80GB": 2.0}}, "add A100 or a default"),
    ({"gpu_hour": {"default": -1.0}}, "pricing.gpu_hour.default: -1.0 is not allowed"),
    ({"gpu_hour": {"default": float("nan")}}, "pricing.gpu_hour.default"),
    ({"gpu_hour": {}}, "pricing.gpu_hour"),
    ({"currency": "EUR"}, "pricing.gpu_hour: a value is required"),
    ({"gpu_hour": {"default": 1.0}, "per": "hour"}, "pricing.per"),
])
def test_bad_pricing_names_the_field(pricing, fragment):
    with pytest.raises(PolicyError) as info:
        _rules(pricing)
    assert fragment in str(info.value)
