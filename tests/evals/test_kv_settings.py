import pytest

from kvbench.evals.kv_settings import KVSetting, baseline_of, kv_settings
from kvbench.settings import SettingsError


def test_fp8_dtypes_expand_over_scales_and_unquantized_ones_do_not():
    settings = kv_settings(["fp32", "fp8_e4m3", "fp16", "fp8_e5m2"], ["tensor", "channel"])
    assert [s.label for s in settings] == [
        "fp32",
        "fp8_e4m3/tensor",
        "fp8_e4m3/channel",
        "fp16",
        "fp8_e5m2/tensor",
        "fp8_e5m2/channel",
    ]
    assert baseline_of(settings) == KVSetting("fp32")


def test_a_list_without_an_unquantized_dtype_is_refused_with_the_fix():
    with pytest.raises(SettingsError, match="no unquantized baseline; add one of fp32"):
        kv_settings(["fp8_e4m3"], ["tensor"])


@pytest.mark.parametrize("dtypes, scales, field", [(["fp9"], ["tensor"], "kv_dtype"), (["fp32"], ["row"], "kv_scale")])
def test_unknown_names_are_refused(dtypes, scales, field):
    with pytest.raises(SettingsError, match=field):
        kv_settings(dtypes, scales)
