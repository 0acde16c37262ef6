import torch

torch.set_num_threads(1)

import dataclasses  # noqa: E402
import typing  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.config import TrainConfig, config_to_dict, load_config  # noqa: E402
from flowrl.configlib import ConfigError, apply_overrides, from_dict  # noqa: E402

TOY = ["fdfo", "flow_grpo", "dance_grpo", "vg_grpo", "offline_weighted", "closed_loop"]


@pytest.mark.parametrize("name", TOY)
def test_yaml_is_a_serialised_instance(name, tmp_path):
    cfg = load_config(f"configs/toy/{name}.yaml")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg)))
    again = load_config(str(path))
    assert config_to_dict(again) == config_to_dict(cfg)


def test_overrides_reach_nested_and_polymorphic_sections():
    cfg = load_config("configs/toy/flow_grpo.yaml", ["optim.lr=0.5", "algorithm.kl_beta=0.2", "chain.shift=3"])
    assert cfg.optim.lr == 0.5 and cfg.algorithm.kl_beta == 0.2 and cfg.chain.shift == 3.0
    assert type(cfg.algorithm).__name__ == "GRPOConfig"
    cfg = load_config("configs/toy/flow_grpo.yaml", ["algorithm.name=vg_grpo"])
    assert type(cfg.algorithm).__name__ == "VGGRPOConfig" and cfg.algorithm.group_size == 8  # from the YAML


def test_exponent_without_a_dot_is_a_number():
    # YAML 1.1 reads 3e-4 as a string; float fields accept it, in overrides and in files
    cfg = load_config("configs/toy/flow_grpo.yaml", ["optim.lr=3e-4", "algorithm.kl_beta=1E-2"])
    assert cfg.optim.lr == 3e-4 and cfg.algorithm.kl_beta == 0.01
    with pytest.raises(ConfigError, match="optim.lr: expected a number"):
        load_config("configs/toy/flow_grpo.yaml", ["optim.lr=fast"])


def test_tuple_fields_take_values_from_yaml_and_overrides(tmp_path):
    # Tuple[str, ...] and fixed-length Tuple[float, float] fields, nested in a registry section
    import planners.driving  # noqa: F401  (registers the driving env)

    over = ["env.scene.kinds=[highway]", "env.accel_limits=[-6, 4]"]
    cfg = load_config("configs/driving/ci.yaml", over)
    assert cfg.env.scene.kinds == ("highway",) and cfg.env.accel_limits == (-6.0, 4.0)
    assert all(type(v) is float for v in cfg.env.accel_limits)
    with pytest.raises(ConfigError, match=r"env.accel_limits\[1\]: expected a number"):
        load_config("configs/driving/ci.yaml", ["env.accel_limits=[-6, fast]"])
    with pytest.raises(ConfigError, match="expected 2 values"):
        load_config("configs/driving/ci.yaml", ["env.accel_limits=[-6]"])
    path = tmp_path / "c.yaml"  # and the config survives a YAML round trip
    path.write_text(yaml.safe_dump(config_to_dict(cfg)))
    assert config_to_dict(load_config(str(path))) == config_to_dict(cfg)


def test_paper_defaults():
    cfg = load_config("configs/toy/flow_grpo.yaml", ["algorithm={name: flow_grpo}"])
    assert (cfg.algorithm.group_size, cfg.algorithm.clip_range, cfg.algorithm.kl_beta) == (24, 1e-4, 0.04)
    cfg = load_config("configs/toy/flow_grpo.yaml", ["algorithm={name: vg_grpo}"])
    a = cfg.algorithm
    assert (a.std1, a.std2, a.clip_range, a.clip_range_high, a.kl_beta, a.kl_type, a.step_gamma) == \
        (0.03, 0.06, 0.15, 0.2, 0.1, "k3", 0.9)
    cfg = load_config("configs/toy/fdfo.yaml", ["algorithm={name: fdfo}", "sampler={name: churn}"])
    assert cfg.algorithm.eps == 0.03 and cfg.sampler.gamma == 0.0025


@pytest.mark.parametrize("override, key", [
    (["max_step=3"], "max_steps"),
    (["optim.lrr=1"], "optim.lrr"),
    (["max_steps=abc"], "max_steps"),
    (["resume=maybe"], "resume"),
    (["algorithm.name=ppo"], "algorithm.name"),
    (["sampler.name=euler"], "sampler.name"),
    (["algorithm.group_size=1"], "algorithm.group_size"),
    (["optim.schedule=bogus"], "optim.schedule"),
    (["rewards=[]"], "rewards"),
    (["eval.metrics=[{name: nope}]"], "eval.metrics[0].name"),
])
def test_errors_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config("configs/toy/flow_grpo.yaml", override)
    msg = str(e.value)
    assert key in msg and "\n" not in msg


def test_a_trained_step_without_noise_is_refused(tmp_path):
    """CPS's last step (to t = 0) has std 0: the trainer refuses a window that reaches it,
    slid there or not, in one line that names the fix, and builds once the window ends before it."""
    from flowrl.trainer import Trainer

    base = [f"output_dir={tmp_path}", "sampler={name: cps, eta: 0.5}", "chain.num_steps=10"]
    for extra in ([], ["chain.train_window_size=3", "chain.window_slide_every=2"]):
        with pytest.raises(ConfigError, match=r"step 9 .*chain\.train_window_size=9") as e:
            Trainer(load_config("configs/toy/flow_grpo.yaml", base + extra))
        assert "\n" not in str(e.value)
    trainer = Trainer(load_config("configs/toy/flow_grpo.yaml", base + ["chain.train_window_size=9"]))
    assert trainer.sampler.__class__.__name__ == "FlowCPSSampler"
    trainer.close()


def test_missing_required_top_level_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("seed: 0\noutput_dir: x\nmax_steps: 1\n")
    with pytest.raises(ConfigError, match="resume"):
        load_config(str(p))


def test_every_field_has_a_help_line():
    from flowrl.registry import ALGORITHMS, DATASETS, ENVIRONMENTS, HEADS
    from rewards import REWARDS

    classes = {TrainConfig}
    for reg in (ALGORITHMS, DATASETS, ENVIRONMENTS, HEADS, REWARDS):
        classes |= {reg.get(n).config_cls for n in reg.names()}
    seen = set()
    while classes:
        cls = classes.pop()
        seen.add(cls)
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help line"
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]) and hints[f.name] not in seen:
                classes.add(hints[f.name])


def test_apply_overrides_creates_sections_and_parses_values():
    data = apply_overrides({"a": {"b": 1}}, ["a.c=[1, 2]", "d.e=true", "f=x y"])
    assert data == {"a": {"b": 1, "c": [1, 2]}, "d": {"e": True}, "f": "x y"}


def test_from_dict_rejects_unknown_keys_with_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        from_dict(TrainConfig, {"max_stepz": 1})
