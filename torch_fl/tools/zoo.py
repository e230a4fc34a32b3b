"""The model zoo: real model code nobody here wrote, on every backend.

Each entry is a Hugging Face `transformers` architecture with a tiny
random-init config (no hub access needed) or a plain `torch.nn` model, and
its inputs. `check(name, backend)` runs, for one model on one backend, what a
user's first training step does and reports what came out:

* forward and backward: the main output and every parameter's gradient,
  against a float64 CPU run, relative to each tensor's scale, next to native
  float32 CPU's error (`torch_fl.tools.numerics`: branch-matched float64
  references, so a ReLU that flips at a rounding-level input is not mistaken
  for a precision fault); the ratio must stay within 10x;
* one AdamW step, fed identical gradients on every side, against float64;
* parameter sharing: every group of parameters that is one object on the CPU
  (tied input/output embeddings) must be one object after `.to("fl")`;
* for causal LMs, greedy `generate()` of 8 tokens, equal to the CPU's;
* the ops that took the CPU fallback: what still needs the host with
  `FL_CPU_FALLBACK=0`.

A tied model whose sharing `.to("fl")` split would train wrongly (the split
copies get partial gradients), so a split fails its row outright.

`run_zoo()` makes the table (`torch-fl zoo` prints it); `train_curve()` runs
the longer check: N AdamW steps of a small LM on a backend and on the CPU."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..progress import Reporter
from ..progress import start as start_progress
from ..rendering import Report
from .numerics import FLOOR, LIMIT, Float64Comparison, Float64Reference, record, scaled_error

if TYPE_CHECKING:
    from transformers import PretrainedConfig

SEED = 0
NEW_TOKENS = 8


# -- hand-written reference models --------------------------------------------------------
#
# Used by `torch-fl doctor`, the zoo's torch.nn rows, the tests and the benchmarks. torchvision cannot
# always be installed beside a given torch wheel, so the ResNet-50 here is defined locally (same
# architecture as torchvision's resnet50: Bottleneck blocks [3, 4, 6, 3], expansion 4).


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: Sequence[int] = (3, 4, 6, 3), num_classes: int = 1000, width: int = 64):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(width, layers[0])
        self.layer2 = self._layer(width * 2, layers[1], stride=2)
        self.layer3 = self._layer(width * 4, layers[2], stride=2)
        self.layer4 = self._layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4)
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000) -> ResNet:
    return ResNet((3, 4, 6, 3), num_classes)


def transformer_encoder(
    d_model: int = 512, nhead: int = 8, num_layers: int = 6, dropout: float = 0.1, dim_feedforward: int = 2048
) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout, batch_first=True
    )
    return nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False)


class LstmLM(nn.Module):
    """A word-level LSTM language model (embedding, 2-layer LSTM, tied-free output layer)."""

    def __init__(self, vocab: int = 96, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(input_ids))[0])


class GruClassifier(nn.Module):
    """A bidirectional GRU over token embeddings, mean-pooled, into class logits."""

    def __init__(self, vocab: int = 96, dim: int = 32, classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(self.embed(input_ids))[0].mean(1))


# -- the models ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooModel:
    """One architecture: how to build it (random init) and its CPU inputs."""

    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict]
    causal_lm: bool = False
    tied: bool = False  # shares parameters (tied input/output embeddings); tests/tools/test_zoo.py checks it


MODELS: dict[str, ZooModel] = {}

_TEXT = dict(vocab_size=96)
_B, _T = 2, 8  # batch, sequence length


def _tokens(n: int = _T, vocab: int = 96, low: int = 3) -> torch.Tensor:
    return torch.randint(low, vocab, (_B, n), generator=torch.Generator().manual_seed(SEED + 1))


def _floats(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(SEED + 2))


def _text_inputs() -> dict:
    return {"input_ids": _tokens()}


def _seq2seq_inputs() -> dict:
    return {"input_ids": _tokens(), "decoder_input_ids": _tokens(6)}


def _hf(class_name: str, config_name: str, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        _no_randomness(cfg)
        torch.manual_seed(SEED)
        return getattr(transformers, class_name)(cfg)

    return build


def _no_randomness(cfg: PretrainedConfig) -> None:
    """Dropout (`*dropout*`, GPT-2's `*_pdrop`), layer drop, drop path and SpecAugment masking off:
    two devices' random streams never match, and the comparison is about arithmetic (sub-configs
    too)."""
    for key, value in list(vars(cfg).items()):
        if isinstance(value, float) and ("drop" in key or key.startswith("mask_") and key.endswith("_prob")):
            setattr(cfg, key, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _no_randomness(value)


def _add(
    name: str,
    family: str,
    build: Callable[[], nn.Module],
    inputs: Callable[[], dict] = _text_inputs,
    causal_lm: bool = False,
) -> None:
    """A family that starts "(tied" declares shared parameters (tests/tools/test_zoo.py checks the claim)."""
    MODELS[name] = ZooModel(name, family, build, inputs, causal_lm, tied="(tied" in family)


_LAYERS = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_add(
    "bert",
    "encoder (tied)",
    _hf("BertForMaskedLM", "BertConfig", hidden_size=32, max_position_embeddings=64, **_LAYERS, **_TEXT),
)
_add(
    "roberta",
    "encoder (tied)",
    _hf(
        "RobertaForMaskedLM",
        "RobertaConfig",
        hidden_size=32,
        max_position_embeddings=66,
        pad_token_id=1,
        **_LAYERS,
        **_TEXT,
    ),
)
_add(
    "distilbert",
    "encoder (tied)",
    _hf(
        "DistilBertForMaskedLM",
        "DistilBertConfig",
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=64,
        **_TEXT,
    ),
)
_add(
    "albert",
    "encoder (tied)",
    _hf(
        "AlbertForMaskedLM",
        "AlbertConfig",
        embedding_size=16,
        hidden_size=32,
        max_position_embeddings=64,
        **_LAYERS,
        **_TEXT,
    ),
)
_add(
    "deberta-v2",
    "encoder (tied)",
    _hf(
        "DebertaV2ForMaskedLM",
        "DebertaV2Config",
        hidden_size=32,
        max_position_embeddings=64,
        relative_attention=True,
        position_buckets=8,
        pos_att_type=["p2c", "c2p"],
        **_LAYERS,
        **_TEXT,
    ),
)
_add(
    "electra",
    "encoder (tied)",
    _hf(
        "ElectraForMaskedLM",
        "ElectraConfig",
        embedding_size=16,
        hidden_size=32,
        max_position_embeddings=64,
        **_LAYERS,
        **_TEXT,
    ),
)
_IDS = dict(bos_token_id=1, eos_token_id=2)  # inside the tiny vocabulary (the defaults are the real ones')
_add(
    "gpt2",
    "decoder (tied)",
    _hf("GPT2LMHeadModel", "GPT2Config", n_positions=64, n_embd=32, n_layer=2, n_head=4, **_IDS, **_TEXT),
    causal_lm=True,
)
_add(
    "gpt-neo",
    "decoder (tied, local attention)",
    _hf(
        "GPTNeoForCausalLM",
        "GPTNeoConfig",
        max_position_embeddings=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        intermediate_size=64,
        **_IDS,
        **_TEXT,
    ),
    causal_lm=True,
)
_add(
    "opt",
    "decoder (tied, ReLU)",
    _hf(
        "OPTForCausalLM",
        "OPTConfig",
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
        **_TEXT,
    ),
    causal_lm=True,
)
_add(
    "llama",
    "decoder (untied)",
    _hf(
        "LlamaForCausalLM",
        "LlamaConfig",
        hidden_size=32,
        max_position_embeddings=64,
        num_key_value_heads=4,
        **_LAYERS,
        **_TEXT,
    ),
    causal_lm=True,
)
_add(
    "mistral",
    "decoder (untied, GQA, sliding window)",
    _hf(
        "MistralForCausalLM",
        "MistralConfig",
        hidden_size=32,
        max_position_embeddings=64,
        num_key_value_heads=2,
        sliding_window=4,
        **_LAYERS,
        **_TEXT,
    ),
    causal_lm=True,
)
_add(
    "qwen2",
    "decoder (tied, GQA)",
    _hf(
        "Qwen2ForCausalLM",
        "Qwen2Config",
        hidden_size=32,
        max_position_embeddings=64,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **_LAYERS,
        **_TEXT,
    ),
    causal_lm=True,
)
_add(
    "gpt-bigcode",
    "decoder (tied, multi-query)",
    _hf(
        "GPTBigCodeForCausalLM",
        "GPTBigCodeConfig",
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        multi_query=True,
        **_IDS,
        **_TEXT,
    ),
    causal_lm=True,
)
_add(
    "mixtral",
    "decoder (mixture of experts)",
    _hf(
        "MixtralForCausalLM",
        "MixtralConfig",
        hidden_size=32,
        max_position_embeddings=64,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        **_LAYERS,
        **_TEXT,
    ),
    causal_lm=True,
)
_add(
    "t5",
    "encoder-decoder (tied, ReLU)",
    _hf(
        "T5ForConditionalGeneration",
        "T5Config",
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
        **_TEXT,
    ),
    _seq2seq_inputs,
)
_add(
    "bart",
    "encoder-decoder (tied)",
    _hf(
        "BartForConditionalGeneration",
        "BartConfig",
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        **_TEXT,
    ),
    _seq2seq_inputs,
)
# 64x64 keeps 2x2 positions in the last stage: a batch norm over 2 values (1x1 at 32x32) is
# analytically constant, and its backward is pure rounding noise on every implementation
_add(
    "resnet",
    "CNN (batch norm, max pool)",
    _hf(
        "ResNetForImageClassification",
        "ResNetConfig",
        embedding_size=8,
        hidden_sizes=[8, 16, 32, 32],
        depths=[1, 1, 1, 1],
        layer_type="bottleneck",
        num_labels=10,
    ),
    lambda: {"pixel_values": _floats(_B, 3, 64, 64)},
)
_add(
    "convnext",
    "CNN (depthwise, layer norm)",
    _hf(
        "ConvNextForImageClassification",
        "ConvNextConfig",
        hidden_sizes=[8, 16, 32, 32],
        depths=[1, 1, 1, 1],
        num_labels=10,
    ),
    lambda: {"pixel_values": _floats(_B, 3, 32, 32)},
)
_add(
    "vit",
    "vision transformer",
    _hf(
        "ViTForImageClassification", "ViTConfig", image_size=16, patch_size=4, hidden_size=32, num_labels=10, **_LAYERS
    ),
    lambda: {"pixel_values": _floats(_B, 3, 16, 16)},
)
_add(
    "swin",
    "windowed attention",
    _hf(
        "SwinForImageClassification",
        "SwinConfig",
        image_size=32,
        patch_size=2,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        num_labels=10,
    ),
    lambda: {"pixel_values": _floats(_B, 3, 32, 32)},
)
_add(
    "wav2vec2",
    "speech (conv front end, CTC)",
    _hf(
        "Wav2Vec2ForCTC",
        "Wav2Vec2Config",
        vocab_size=32,
        hidden_size=32,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        **_LAYERS,
    ),
    lambda: {"input_values": _floats(_B, 800)},
)
_add(
    "whisper",
    "speech encoder-decoder (tied)",
    _hf(
        "WhisperForConditionalGeneration",
        "WhisperConfig",
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=32,
        decoder_start_token_id=1,
        pad_token_id=0,
        **_TEXT,
    ),
    lambda: {"input_features": _floats(_B, 8, 32), "decoder_input_ids": _tokens(6)},
)
_add(
    "clip",
    "multimodal (text + vision)",
    _hf(
        "CLIPModel",
        "CLIPConfig",
        projection_dim=16,
        text_config=dict(vocab_size=96, hidden_size=32, max_position_embeddings=16, **_IDS, **_LAYERS),
        vision_config=dict(image_size=16, patch_size=4, hidden_size=32, **_LAYERS),
    ),
    lambda: {"input_ids": _tokens(), "pixel_values": _floats(_B, 3, 16, 16)},
)


def _seeded(cls: type) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(SEED)
        return cls()

    return build


_add("lstm-lm", "torch.nn recurrent (LSTM LM)", _seeded(LstmLM))
_add("gru-classifier", "torch.nn recurrent (GRU)", _seeded(GruClassifier))


# -- one model on one backend --------------------------------------------------------------


@dataclass
class ZooResult:
    """What `check` found for one model on one backend (plain data: the table and JSON)."""

    model: str
    backend: str
    family: str = ""
    passed: bool = False
    error: str | None = None  # an exception, if the run failed
    device_error: float = math.nan  # worst over output and gradients, against float64
    native_error: float = math.nan
    ratio: float = math.nan
    worst: str | None = None
    flips: int = 0  # rounding-level branch flips the float64 reference took from the device run
    step_ratio: float = math.nan  # one AdamW step with identical gradients, device vs native error ratio
    shared_groups: int = 0  # groups of parameters that are one object on the CPU
    sharing_kept: bool | None = None  # None: the model shares nothing
    generate: str = "n/a"  # "equal", "differs at token i", "tie at token i" (a rounding-level argmax)
    host_ops: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _main_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "logits_per_image", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    return next(v for v in (out.to_tuple() if hasattr(out, "to_tuple") else out) if isinstance(v, torch.Tensor))


def _inputs_on(inputs: dict, device: torch.device | str, dtype: torch.dtype) -> dict:
    return {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}


def sharing_groups(model: nn.Module) -> list[list[str]]:
    """Names of the parameters that are one object (two or more names each)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def sharing_kept(model: nn.Module, groups: list[list[str]]) -> bool:
    """Every group is still one object in `model` (e.g. after `.to("fl")`)."""
    return all(len({id(model.get_parameter(n)) for n in names}) == 1 for names in groups)


class _Case:
    """One model's runs: a CPU float32 base, and `forward_backward(device, dtype)` in the shape
    torch_fl.tools.numerics expects, optionally re-tying on the device."""

    def __init__(self, spec: ZooModel):
        self.spec = spec
        self.base = spec.build().float()
        self.base.train()
        self.inputs = spec.inputs()
        self.names = [n for n, p in self.base.named_parameters() if p.requires_grad]
        self.models: dict[str, nn.Module] = {}

    def fresh(self, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
        m = copy.deepcopy(self.base).to(dtype)
        if dtype == torch.float64 and hasattr(m, "set_experts_implementation"):
            # mixture-of-experts layers default to torch._grouped_mm, which has no float64 kernel;
            # the eager loop over experts is the same arithmetic
            with contextlib.suppress(ValueError, AttributeError):
                m.set_experts_implementation("eager")  # type: ignore[operator]  # transformers' method (hasattr)
        if torch.device(device).type != "cpu":
            m = m.to(device)  # the user's path: Module.to
        return m

    def forward_backward(self, device: torch.device | str, dtype: torch.dtype) -> dict:
        m = self.fresh(device, dtype)
        out = _main_output(m(**_inputs_on(self.inputs, device, dtype)))
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(SEED + 3))
        (out * weights.to(device, out.dtype)).sum().backward()
        self.models[str(dtype)] = m
        grads = {f"grad.{n}": m.get_parameter(n).grad for n in self.names}
        return {"output": out, **grads}


def _adamw_step(model: nn.Module, names: list[str], grads64: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One AdamW step of `model` from the given gradients (float64's, rounded to float32, so every
    side starts from identical numbers); the parameters after it, on the CPU."""
    params = []
    for n in names:
        p = model.get_parameter(n)
        g = grads64.get(f"grad.{n}")
        p.grad = None if g is None else g.float().to(dtype).to(p.device)
        params.append(p)
    torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01).step()
    return {n: model.get_parameter(n).detach().cpu().double() for n in names}


def _step_error(after: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    return max((scaled_error(after[n], ref[n]) for n in ref), default=0.0)


class _Baseline:
    """What does not depend on the backend, computed once per model: the native float32 run, its
    float64 reference (shared by every device run that takes the same branches), the AdamW step
    natively and in float64, and the CPU's greedy generation."""

    def __init__(self, spec: ZooModel):
        self.case = _Case(spec)
        self.groups = sharing_groups(self.case.base)
        self.reference = Float64Reference(self.case.forward_backward)
        self.native = self.reference.against(record(self.case.forward_backward, "cpu"))
        ref, _ = self.reference.outputs_for(record(self.case.forward_backward, "cpu").decisions)
        self.grads64 = {k: v for k, v in ref.items() if k.startswith("grad.")}
        names = self.case.names
        self.step64 = _adamw_step(self.case.fresh("cpu", torch.float64), names, self.grads64, torch.float64)
        self.native_step_error = _step_error(
            _adamw_step(self.case.fresh("cpu", torch.float32), names, self.grads64, torch.float32), self.step64
        )
        self.generated = _generate(self.case, "cpu") if spec.causal_lm else None


_BASELINES: dict[str, _Baseline] = {}


def _baseline(name: str) -> _Baseline:
    if name not in _BASELINES:
        _BASELINES[name] = _Baseline(MODELS[name])
    return _BASELINES[name]


def _generate(case: _Case, device: torch.device | str) -> torch.Tensor:
    ids = case.inputs["input_ids"][:, :4]
    with torch.no_grad():
        model = case.fresh(device, torch.float32).eval()
        generate: Any = model.generate  # transformers' GenerationMixin method (nn.Module's typing says tensor)
        out = generate(
            input_ids=ids.to(device),
            attention_mask=torch.ones_like(ids).to(device),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return out.cpu()


def _generate_verdict(case: _Case, want: torch.Tensor, got: torch.Tensor) -> str:
    """ "equal"; else where the tokens part, and whether the CPU's own logits there were a near tie
    (a rounding-level argmax, not a fault)."""
    if torch.equal(got, want):
        return "equal"
    prompt = 4
    step = int((got != want).any(0).nonzero()[0]) if got.shape == want.shape else prompt
    with torch.no_grad():
        logits = case.fresh("cpu", torch.float64).eval()(input_ids=want[:, :step]).logits[:, -1]
    top2 = logits.topk(2, -1).values
    gap = ((top2[:, 0] - top2[:, 1]) / logits.abs().amax(-1).clamp_min(1e-30)).min().item()
    return f"{'tie' if gap < 1e-5 else 'differs'} at token {step - prompt}"


def check(name: str, backend: str) -> ZooResult:
    """Runs model `name` on fl backend `backend` (forward, backward, one AdamW step, sharing,
    generate) against the CPU; see the module docstring."""
    from ..runtime import REGISTRY
    from .profiler import profile

    spec = MODELS[name]
    result = ZooResult(name, backend, spec.family)
    t0 = time.perf_counter()
    device = REGISTRY.get(backend).devices[0].torch_device
    try:
        base = _baseline(name)
        case = base.case
        result.shared_groups = len(base.groups)
        if base.groups:
            result.sharing_kept = sharing_kept(case.fresh(device, torch.float32), base.groups)
        # everything the check runs on the device is profiled, the AdamW step and generate() too: the host-ops
        # column promises what FL_CPU_FALLBACK=0 would refuse, and ops used only there count as much
        with profile(label=backend) as prof:
            rec = record(case.forward_backward, device)
            after = _adamw_step(case.models[str(torch.float32)], case.names, base.grads64, torch.float32)
            generated = _generate(case, device) if spec.causal_lm else None
        result.host_ops = sorted(s.op for s in prof.fallbacks())
        dev = base.reference.against(rec)
        cmp = Float64Comparison(dev, base.native)
        result.device_error, result.native_error, result.ratio = cmp.device_error, cmp.native_error, cmp.ratio
        result.worst, result.flips = max(cmp.per_tensor, key=lambda k: cmp.per_tensor[k]), dev.flips
        result.step_ratio = max(_step_error(after, base.step64), FLOOR) / max(base.native_step_error, FLOOR)
        if spec.causal_lm:
            assert base.generated is not None and generated is not None, "a causal LM generates on both sides"
            result.generate = _generate_verdict(case, base.generated, generated)
        result.passed = (
            cmp.ok
            and result.step_ratio <= LIMIT
            and result.sharing_kept is not False
            and (result.generate in ("n/a", "equal") or result.generate.startswith("tie"))
        )
    except Exception as e:  # noqa: BLE001 - the zoo reports, it does not stop
        result.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    result.seconds = time.perf_counter() - t0
    return result


# -- the table -------------------------------------------------------------------------------


@dataclass
class ZooReport(Report):
    results: list[ZooResult]
    backends: list[str]

    def to_json(self, **kw: Any) -> str:
        return json.dumps({"backends": self.backends, "results": [asdict(r) for r in self.results]}, **kw)

    def render(self) -> str:
        """One row per model and backend; columns explained in docs/models.md."""
        head = (
            f"{'model':<15} {'backend':<8} {'pass':<5} {'error':>8} {'x native':>8} {'step':>5} {'sharing':<8} "
            f"{'generate':<18} host ops (FL_CPU_FALLBACK=0)"
        )
        lines = [head, "-" * len(head)]
        for r in self.results:
            if r.error:
                lines.append(f"{r.model:<15} {r.backend:<8} {'FAIL':<5} {r.error}")
                continue
            sharing = "-" if r.sharing_kept is None else ("kept" if r.sharing_kept else "SPLIT")
            lines.append(
                f"{r.model:<15} {r.backend:<8} {'yes' if r.passed else 'NO':<5} {r.device_error:>8.1e} "
                f"{r.ratio:>8.2g} {r.step_ratio:>5.2g} {sharing:<8} {r.generate:<18} "
                f"{', '.join(o.replace('aten::', '') for o in r.host_ops) or '-'}"
            )
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        rows = self.results
        passed = sum(r.passed for r in rows)
        split = sum(r.sharing_kept is False for r in rows)
        text = f"{passed}/{len(rows)} rows pass"
        if split:
            text += f"; {split} rows of tied models lose their sharing in .to('fl')"
        return text


def run_zoo(
    models: list[str] | None = None, backends: list[str] | None = None, progress: bool | Reporter = True
) -> ZooReport:
    """check() for every model (default: all of MODELS) on every backend (default: all found). progress:
    each row shown as it ends (torch_fl.progress: lines in a terminal, a bar in a notebook); False for none."""
    from ..runtime import REGISTRY

    backends = backends or sorted(REGISTRY.backends)
    names = models or list(MODELS)
    results: list[ZooResult] = []
    shown = start_progress("model zoo", len(names) * len(backends), progress)
    try:
        for name in names:
            for b in backends:
                r = check(name, b)
                results.append(r)
                shown.update(
                    len(results),
                    f"{r.model} on {r.backend}: {'pass' if r.passed else 'FAIL'} ({r.seconds:.1f}s)",
                    failed=not r.passed,
                )
    finally:
        shown.close()
    return ZooReport(results, backends)


# -- the longer run ----------------------------------------------------------------------------


@dataclass
class TrainCurve:
    model: str
    backend: str
    losses: list[float]
    cpu_losses: list[float]

    @property
    def max_rel_diff(self) -> float:
        return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(self.losses, self.cpu_losses, strict=True))


def train_curve(name: str = "llama", backend: str = "cpu", steps: int = 30, lr: float = 1e-3) -> TrainCurve:
    """`steps` AdamW steps of causal LM `name` on a fixed batch (next-token cross entropy), on
    the backend and natively on the CPU, from the same weights."""
    from ..runtime import REGISTRY

    spec = MODELS[name]
    case = _Case(spec)
    tokens = case.inputs["input_ids"]
    curves = []
    for device in (REGISTRY.get(backend).devices[0].torch_device, torch.device("cpu")):
        model = case.fresh(device, torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        ids = tokens.to(device)
        losses = []
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            logits = _main_output(model(input_ids=ids[:, :-1]))
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach().cpu()))
        curves.append(losses)
    return TrainCurve(name, backend, curves[0], curves[1])
