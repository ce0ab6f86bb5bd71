"""api.torch_state / keras_state and their loaders: a model and its optimizer (moments, step
counts, learning rate) through run.save() and run.restore() and back, with the real
frameworks, one process. After the round trip one more step gives the same weights as the
run that never stopped."""

import numpy as np
import pytest

from hpcsuite import api
from hpcsuite.errors import UserError
from hpcsuite.submit.spec import spec_from_dict


def make_run(tmp_path):
    job = spec_from_dict({"name": "s", "train": {"script": "train.py", "batch_size": 4,
                                                 "epochs": 1, "checkpoint": {"every_steps": 1}}}, "t")
    run_dir = tmp_path / "runs" / "s" / "1"
    run_dir.mkdir(parents=True, exist_ok=True)
    return api.Run(None, job=job, run_dir=run_dir)


def through_a_checkpoint(tmp_path, state: dict) -> dict:
    run = make_run(tmp_path)
    next(iter(run.batches(8)))
    run.save(state)
    return make_run(tmp_path).restore().state


# ---------------------------------------------------------------- torch
torch = pytest.importorskip("torch")


def torch_setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.95))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler


def torch_step(model, optimizer, k):
    g = torch.Generator().manual_seed(100 + k)
    x, y = torch.randn(6, 4, generator=g), torch.randint(0, 2, (6,), generator=g)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def test_torch_model_and_optimizer_round_trip(tmp_path):
    model, optimizer, scheduler = torch_setup()
    for k in range(3):
        torch_step(model, optimizer, k)
        scheduler.step()                            # the lr halves: it must survive too
    state = through_a_checkpoint(tmp_path, api.torch_state(model, optimizer))
    assert set(state) == {"model", "optimizer"}
    assert {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step", "group.0.lr",
            "group.0.betas"} <= set(state["optimizer"])

    fresh, fresh_opt, _ = torch_setup(seed=1)      # other weights, no optimizer state yet
    api.load_torch_state(fresh, fresh_opt, state)
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(0.01 / 8)
    assert fresh_opt.param_groups[0]["betas"] == (0.8, 0.95)
    assert float(fresh_opt.state_dict()["state"][0]["step"]) == 3.0
    torch_step(model, optimizer, 3)
    torch_step(fresh, fresh_opt, 3)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)


def test_torch_sgd_without_momentum_and_a_model_alone(tmp_path):
    model, _, _ = torch_setup()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    torch_step(model, sgd, 0)
    state = api.torch_state(model, sgd)             # plain SGD keeps no per-parameter state
    fresh, _, _ = torch_setup(seed=2)
    fresh_sgd = torch.optim.SGD(fresh.parameters(), lr=0.5)
    api.load_torch_state(fresh, fresh_sgd, state)
    assert fresh_sgd.param_groups[0]["lr"] == 0.1
    only = api.torch_state(model)
    assert set(only) == {"model"}
    api.load_torch_state(fresh, None, only)


def test_torch_state_of_another_model_is_a_user_error(tmp_path):
    model, optimizer, _ = torch_setup()
    torch_step(model, optimizer, 0)
    state = api.torch_state(model, optimizer)
    other = torch.nn.Linear(4, 2)
    with pytest.raises(UserError, match="checkpoint: model: does not fit this model"):
        api.load_torch_state(other, None, state)
    small = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with pytest.raises(UserError, match="checkpoint: optimizer.state.9.exp_avg|state for parameter"):
        bad = {"model": state["model"], "optimizer": {**state["optimizer"],
                                                      "state.9.exp_avg": np.zeros(2)}}
        api.load_torch_state(small, torch.optim.AdamW(small.parameters()), bad)
    with pytest.raises(UserError, match="no 'model' group"):
        api.load_torch_state(small, None, {"state": {}})


# ---------------------------------------------------------------- keras
def keras_setup(keras, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    optimizer = keras.optimizers.AdamW(learning_rate=0.01)
    return model, optimizer


def keras_step(tf, keras, model, optimizer, k):
    rng = np.random.default_rng(100 + k)
    x, y = rng.normal(size=(6, 4)).astype("float32"), rng.integers(0, 2, 6)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            y, model(x, training=True), from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


def test_keras_model_and_optimizer_round_trip(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import keras

    model, optimizer = keras_setup(keras)
    for k in range(3):
        keras_step(tf, keras, model, optimizer, k)
    optimizer.learning_rate.assign(0.005)
    state = through_a_checkpoint(tmp_path, api.keras_state(model, optimizer))
    assert any("iteration" in name for name in state["optimizer"])

    keras.backend.clear_session()                   # a restart: the layers get the same names
    fresh, fresh_opt = keras_setup(keras, seed=1)   # not built: the loader builds it
    api.load_keras_state(fresh, fresh_opt, state)
    assert int(fresh_opt.iterations.numpy()) == 3
    assert float(fresh_opt.learning_rate.numpy()) == pytest.approx(0.005)
    keras_step(tf, keras, model, optimizer, 3)
    keras_step(tf, keras, fresh, fresh_opt, 3)
    for a, b in zip(model.variables, fresh.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    wide = keras.Sequential([keras.Input((4,)), keras.layers.Dense(9), keras.layers.Dense(2)])
    with pytest.raises(UserError, match=r"checkpoint: model(: variables differ|\..*shape)"):
        api.load_keras_state(wide, None, state)
