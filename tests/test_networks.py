"""The networks of tuning/core/networks.py: torchvision's architectures in plain torch (no TVM)."""
import pytest
import torch

from tuning.core.networks import NETWORKS, build_network

# torchvision's parameter counts; BERT-base's encoder layer as in HuggingFace's BertLayer.
PARAMETERS = {
    "resnet18": 11_689_512,
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "squeezenet1_0": 1_248_424,
    "mobilenet_v2": 3_504_872,
    "bert_encoder_layer": 7_087_872,
    # by hand: convs 216 + 1152 + 2304 + 128, four batch norms 16 + 32 + 32 + 32, fc 160 + 10
    "tiny_cnn": 4_082,
}
OUTPUT_SHAPES = ({name: (1, 1000) for name in PARAMETERS}
                 | {"bert_encoder_layer": (1, 128, 768), "tiny_cnn": (1, 10)})


def test_every_network_is_listed():
    assert set(NETWORKS) == set(PARAMETERS)


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_builds_runs_and_matches_torchvision(name):
    model, example = build_network(name, seed=0)
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]
    with torch.no_grad():
        output = model(example)
    assert tuple(output.shape) == OUTPUT_SHAPES[name]
    assert torch.isfinite(output).all() and output.std() > 0


@pytest.mark.parametrize("name", ["resnet18", "bert_encoder_layer"])
def test_seed_decides_weights_and_input(name):
    (a, xa), (b, xb), (c, xc) = (build_network(name, seed) for seed in (3, 3, 4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa) and torch.equal(xa, xb)
    random = [k for k in sa if sa[k].is_floating_point() and sa[k].numel() > 1 and sa[k].std() > 0]
    assert random and all(not torch.equal(sa[k], sc[k]) for k in random)  # constant inits (zeros, ones) aside
    assert not torch.equal(xa, xc)


def test_global_rng_untouched():
    state = torch.get_rng_state()
    build_network("squeezenet1_0", seed=1)
    assert torch.equal(torch.get_rng_state(), state)


def test_batch_norm_is_not_the_identity():
    """Random running statistics, so folding batch norm into convolutions is really tested."""
    model, _ = build_network("resnet18", seed=0)
    assert model.bn1.running_var.std() > 0 and model.bn1.running_mean.abs().max() > 0


def test_unknown_network():
    with pytest.raises(ValueError, match="resnet18"):
        build_network("resnet1000", seed=0)
