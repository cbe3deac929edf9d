import pytest

from freezeopt.actions import Action, parse_action


@pytest.mark.parametrize("text", ["0F3", "12B0", "1I2", "3W15"])
def test_round_trip(text: str) -> None:
    assert str(parse_action(text)) == text


def test_fields_and_kinds() -> None:
    a = parse_action("2W7")
    assert a == Action(2, "W", 7)
    assert a.has_weight_grad and a.is_backward
    assert not Action(0, "I", 0).has_weight_grad
    assert not Action(0, "F", 0).is_backward


@pytest.mark.parametrize("bad", ["", "F3", "0X3", "0F", "0SEND_F1", "a0F1"])
def test_rejects_non_compute_actions(bad: str) -> None:
    with pytest.raises(ValueError, match="not a compute action"):
        parse_action(bad)
