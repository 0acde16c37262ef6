import torch

torch.set_num_threads(1)

import os  # noqa: E402

import pytest  # noqa: E402

from flowrl.trainer import checkpoint as ckpt  # noqa: E402
from flowrl.trainer.trainer import lr_factor  # noqa: E402


def _write(root, step, value, keep=2):
    p = torch.nn.Parameter(torch.full((3,), float(value)))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    return ckpt.write_checkpoint(str(root), step, trainable={"w": torch.full((3,), float(value))}, optimizer=opt.state_dict(),
                                 state={"iteration": step, "opt_step": step}, keep=keep)


def test_round_trip_loads_weights_only(tmp_path):
    path = _write(tmp_path, 3, 1.5)
    state = ckpt.read_checkpoint(path)
    assert torch.equal(state["trainable"]["w"], torch.full((3,), 1.5))
    assert state["state"] == {"iteration": 3, "opt_step": 3}
    assert state["optimizer"]["state"][0]["step"] == 1
    assert state["rng"]["torch"].dtype == torch.uint8


def test_pruning_keeps_newest_and_ignores_incomplete(tmp_path):
    for s in (1, 2, 3):
        _write(tmp_path, s, s)
    assert [s for s, _ in ckpt.list_checkpoints(str(tmp_path))] == [2, 3]
    # an interrupted write: a hidden temp folder and a step folder without trainer_state.json
    os.makedirs(tmp_path / ".tmp-step-4-1")
    os.makedirs(tmp_path / "step-5")
    assert ckpt.latest_checkpoint(str(tmp_path)).endswith("step-3")


def test_rewrite_of_same_step_replaces_it(tmp_path):
    _write(tmp_path, 2, 1.0)
    path = _write(tmp_path, 2, 7.0)
    assert torch.equal(ckpt.read_checkpoint(path)["trainable"]["w"], torch.full((3,), 7.0))
    assert sorted(os.listdir(tmp_path)) == ["step-2"]


def test_replace_dir_keeps_a_complete_folder_if_interrupted(tmp_path, monkeypatch):
    """A crash after the old folder is moved aside leaves it whole beside the new one; a
    finished replace leaves only the new folder."""
    dst, new = tmp_path / "model", tmp_path / "model.tmp"
    for folder, text in ((dst, "old"), (new, "new")):
        folder.mkdir()
        (folder / "w.txt").write_text(text)
    real_rename = os.rename

    def crash_on_second(a, b):
        if str(a) == str(new):
            raise KeyboardInterrupt  # killed between the two renames
        real_rename(a, b)

    monkeypatch.setattr(os, "rename", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        ckpt.replace_dir(str(new), str(dst))
    monkeypatch.setattr(os, "rename", real_rename)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("model.old-")]
    assert len(aside) == 1 and (aside[0] / "w.txt").read_text() == "old"
    assert (new / "w.txt").read_text() == "new"
    ckpt.replace_dir(str(new), str(dst))
    assert (dst / "w.txt").read_text() == "new"
    ckpt.replace_dir(str(aside[0]), str(tmp_path / "restored"))  # into a fresh path: nothing to move aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "restored"]


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="trainable.safetensors"):
        ckpt.read_checkpoint(str(tmp_path))


def test_lr_schedule_values():
    assert lr_factor(0, 4, 20, "constant") == 0.25
    assert lr_factor(3, 4, 20, "constant") == 1.0
    assert lr_factor(4, 4, 20, "linear") == 1.0
    assert lr_factor(12, 4, 20, "linear") == pytest.approx(0.5)
    assert lr_factor(12, 4, 20, "cosine") == pytest.approx(0.5)
    assert lr_factor(20, 4, 20, "cosine") == pytest.approx(0.0)
