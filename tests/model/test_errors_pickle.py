"""A SettingError raised in a Ray actor reaches the driver pickled: it must come back whole,
so the CLI can still name its flag."""

import pickle

import cloudpickle

from elmo_model.errors import SettingError, cli_flag


def test_setting_error_survives_pickling() -> None:
    error = SettingError("device", lambda n: f"{n('device')} cuda: no GPU is visible")
    back = pickle.loads(cloudpickle.dumps(error))
    assert isinstance(back, SettingError)
    assert back.setting == "device"
    assert str(back) == "device cuda: no GPU is visible"
    assert back.named(cli_flag) == "--device cuda: no GPU is visible"
