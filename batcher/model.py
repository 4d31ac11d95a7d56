"""What the runtime serves: a user's torch module or batch callable, with its tensor signature.

A factory (``package.module:factory``) returns either

* a ``torch.nn.Module``: the runtime concatenates the requests' inputs along the first dimension,
  pads to a bucket size when padding is on, calls the module once (``module(*inputs)`` in the
  order of ``input_specs``), and splits the outputs back by each request's item count; or
* a callable over a batch: ``fn(list of {input name: array}) -> list of results``, one result per
  request, each a ``{output name: array}`` mapping or a single array.

Either may carry ``input_specs`` / ``output_specs`` (lists of :class:`TensorSpec` or of mappings
with ``name``, ``datatype``, ``shape``), giving per-item shapes (no batch dimension; -1 = any) and
KServe v2 datatypes. Without them one ``FP32`` input ``input__0`` of any shape is assumed, and one
output ``output__0``, the names Triton's PyTorch backend uses.

Two datatypes have no torch tensor of the same kind, so a torch module sees them as follows:
``BYTES`` inputs arrive as the numpy object arrays of ``bytes`` the protocol decodes (torch has no
string tensors; a tokenizer inside ``forward`` takes them from there), and ``BF16`` inputs, numpy
arrays of ``ml_dtypes.bfloat16`` (see :mod:`batcher.oip`), arrive as ``torch.bfloat16`` tensors.
Each output may be a tensor (``torch.bfloat16`` ones are answered as BF16), a numpy array, or a list
of ``str``/``bytes`` (answered as BYTES; inside a mapping or tuple of outputs, since a bare list
is read as one entry per output).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError
from batcher.execution import BatchExecutor, ThreadExecutor
from batcher.memory import MemoryMonitor, bucket_size, resolve_device
from batcher.model_process import ModelProcess, ModelProcessCollector
from batcher.tensor_spec import TensorSpec
from batcher.torch_loaded import loaded_torch

if TYPE_CHECKING:
    import torch

Payload = dict[str, np.ndarray]


BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Rows of nothing for padding and synthetic batches: zeros, or empty ``bytes`` for BYTES.

    ``np.zeros`` of an object array holds the integer 0, which a text model would choke on.
    """
    if dtype == np.dtype(np.object_):
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=dtype)


def to_numpy(value: Any) -> np.ndarray:
    """A model's output as a numpy array on the host.

    ``torch.bfloat16`` becomes ``ml_dtypes.bfloat16`` bit for bit (``Tensor.numpy`` refuses it);
    lists of ``str``/``bytes`` become object arrays (the fixed-width ``S``/``U`` dtypes numpy
    would pick drop trailing NUL characters).
    """
    torch = loaded_torch()  # not loaded: nothing the model returned is a tensor
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().to("cpu")
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(BFLOAT16)
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    array = np.asarray(value)
    return np.array(value, dtype=object) if array.dtype.kind in "SU" else array


def to_torch(array: np.ndarray, device: torch.device) -> torch.Tensor | np.ndarray:
    """A batch input as the module takes it: a tensor on ``device``; BYTES stay object arrays."""
    import torch

    if array.dtype == np.dtype(np.object_):
        return array
    if array.dtype == BFLOAT16:
        return (
            torch.from_numpy(array.view(np.int16))
            .view(torch.bfloat16)
            .to(device, non_blocking=True)
        )
    return torch.from_numpy(array).to(device, non_blocking=True)


DEFAULT_INPUTS = (TensorSpec("input__0", "FP32", (-1,)),)
DEFAULT_OUTPUTS = (TensorSpec("output__0", "FP32", (-1,)),)


@dataclass(frozen=True)
class ServedModel:
    """A loaded model ready for the engine: its signature and its batch function."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # the batch function, or the process that runs it (``--model-process``)
    run: Callable[[list[Payload]], list[Payload]] | ModelProcess
    batch_size_for: Callable[[int], int]
    device: str

    @property
    def pads(self) -> bool:
        """Whether batches can be padded (torch modules; a batch callable gets what it gets)."""
        if isinstance(self.run, ModelProcess):
            return self.run.pads
        return isinstance(self.run, ModuleRunner)

    def use_buckets(self, buckets: Sequence[int] | None) -> None:
        """Pad batches to ``buckets`` from now on (None: no padding); torch modules only."""
        if isinstance(self.run, (ModuleRunner, ModelProcess)) and self.pads:
            self.run.buckets = tuple(sorted(buckets)) if buckets else None

    def parameter_bytes(self) -> float:
        """Bytes of the model's parameters and buffers (a batch callable's are not known: 0)."""
        if isinstance(self.run, ModelProcess):
            return self.run.parameter_bytes  # counted by the child, which holds them
        return module_bytes(self.run.module) if isinstance(self.run, ModuleRunner) else 0.0

    def executor(self, memory: MemoryMonitor | None, registry: CollectorRegistry) -> BatchExecutor:
        """What runs this model's batches for the engine: its own process when it has one (whose
        series then go on ``registry``), else a thread of this process."""
        if isinstance(self.run, ModelProcess):
            registry.register(ModelProcessCollector(self.run))
            return self.run
        return ThreadExecutor(self.run, self.batch_size_for, memory)

    @classmethod
    def from_process(cls, process: ModelProcess) -> ServedModel:
        """The model a started :class:`ModelProcess` serves, as the engine and server see it."""
        return cls(
            process.name,
            process.inputs,
            process.outputs,
            process,
            process.batch_size_for,
            process.device,
        )


class ModuleRunner:
    """Calls a torch module on the concatenation of many requests' inputs."""

    def __init__(
        self,
        module: torch.nn.Module,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        device: str,
        buckets: Sequence[int] | None,
    ) -> None:
        import torch  # loaded already: the module is one of its classes

        self.module = module
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.device = torch.device(device)
        self._inference_mode = torch.inference_mode
        self.buckets = tuple(buckets) if buckets else None

    def padded(self, items: int) -> int:
        """Rows actually given to the module for ``items`` rows of input."""
        return bucket_size(items, self.buckets) if self.buckets else items

    def __call__(self, payloads: list[Payload]) -> list[Payload]:
        # Requests whose variable dimensions differ cannot share one tensor: run them apart.
        groups: dict[tuple, list[int]] = {}
        for index, payload in enumerate(payloads):
            signature = tuple(payload[spec.name].shape[1:] for spec in self.inputs)
            groups.setdefault(signature, []).append(index)
        results: list[Payload] = [{} for _ in payloads]
        for indices in groups.values():
            for index, result in zip(
                indices, self._run([payloads[i] for i in indices]), strict=True
            ):
                results[index] = result
        return results

    def _run(self, payloads: list[Payload]) -> list[Payload]:
        counts = [len(p[self.inputs[0].name]) for p in payloads]
        rows = sum(counts)
        target = self.padded(rows)
        tensors = []
        for spec in self.inputs:
            stacked = np.concatenate([p[spec.name] for p in payloads], axis=0)
            if target > rows:
                filler = zeros((target - rows, *stacked.shape[1:]), stacked.dtype)
                stacked = np.concatenate([stacked, filler], axis=0)
            tensors.append(to_torch(stacked, self.device))
        with self._inference_mode():
            produced = self.module(*tensors)
        named = _name_outputs(produced, self.outputs)
        arrays = {name: to_numpy(value)[:rows] for name, value in named.items()}
        results = []
        offset = 0
        for count in counts:
            results.append({name: array[offset : offset + count] for name, array in arrays.items()})
            offset += count
        return results


class CallableRunner:
    """Calls a user's batch function and normalises what it returns."""

    def __init__(self, fn: Callable[[list[Payload]], Sequence[Any]], outputs: Sequence[TensorSpec]):
        self.fn = fn
        self.outputs = tuple(outputs)

    def __call__(self, payloads: list[Payload]) -> list[Payload]:
        produced = list(self.fn(payloads))
        if len(produced) != len(payloads):
            raise ValueError(f"model returned {len(produced)} results for {len(payloads)} requests")
        return [
            {name: to_numpy(value) for name, value in _name_outputs(item, self.outputs).items()}
            for item in produced
        ]


def _name_outputs(produced: Any, outputs: Sequence[TensorSpec]) -> dict[str, Any]:
    if isinstance(produced, Mapping):
        return dict(produced)
    if isinstance(produced, (tuple, list)):
        if len(produced) != len(outputs):
            raise ValueError(
                f"model returned {len(produced)} outputs but declares {len(outputs)} "
                f"({', '.join(s.name for s in outputs)})"
            )
        return {spec.name: value for spec, value in zip(outputs, produced, strict=True)}
    return {outputs[0].name: produced}


def module_bytes(module: torch.nn.Module) -> float:
    """Bytes of a module's parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return float(sum(t.numel() * t.element_size() for t in tensors))


def _specs(raw: Any, default: tuple[TensorSpec, ...], what: str) -> tuple[TensorSpec, ...]:
    if raw is None:
        return default
    specs = []
    for item in raw:
        if isinstance(item, TensorSpec):
            specs.append(item)
        elif isinstance(item, Mapping) and {"name", "datatype", "shape"} <= set(item):
            specs.append(TensorSpec(str(item["name"]), str(item["datatype"]), tuple(item["shape"])))
        else:
            raise ConfigError(
                f"{what} entries must be TensorSpec or mappings with name, datatype, shape; "
                f"got {item!r}"
            )
    if not specs:
        raise ConfigError(f"{what} must name at least one tensor")
    return tuple(specs)


def load_model(
    target: str,
    *,
    name: str = "",
    checkpoint: str = "",
    device: str = "cpu",
    buckets: Sequence[int] | None = None,
) -> ServedModel:
    """Import ``package.module:factory``, call it, and wrap what it returns.

    ``buckets`` turns padding on (torch modules only). Raises :class:`ConfigError` with the fix
    when the target cannot be imported, is not callable, or returns something unusable.
    """
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"--model {target!r}: cannot import {module_name!r} ({exc}); "
            "check the module is installed or on PYTHONPATH"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"--model {target!r}: {module_name} has no callable {attr!r}")
    if checkpoint:
        params = inspect.signature(factory).parameters
        takes_checkpoint = "checkpoint" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )
        if not takes_checkpoint:
            raise ConfigError(
                f"--checkpoint given but {target} takes no checkpoint= argument; "
                "drop --checkpoint or add the parameter to the factory"
            )
        served = factory(checkpoint=checkpoint)
    else:
        served = factory()
    default_name = module_name.rsplit(".", 1)[-1]
    return wrap_model(
        served, name=name, default_name=default_name, device=device, buckets=buckets, source=target
    )


def wrap_model(
    served: Any,
    *,
    name: str = "",
    default_name: str = "model",
    device: str = "cpu",
    buckets: Sequence[int] | None = None,
    source: str = "the model",
) -> ServedModel:
    """Wrap what a factory returned (torch module or batch callable) for the engine."""
    inputs = _specs(getattr(served, "input_specs", None), DEFAULT_INPUTS, f"{source} input_specs")
    outputs = _specs(
        getattr(served, "output_specs", None), DEFAULT_OUTPUTS, f"{source} output_specs"
    )
    model_name = name or getattr(served, "model_name", "") or default_name
    torch = loaded_torch()  # a torch module's factory imported it; anything else need not
    if torch is not None and isinstance(served, torch.nn.Module):
        device = resolve_device(device)
        served.to(device).eval()
        runner = ModuleRunner(served, inputs, outputs, device, buckets)
        return ServedModel(model_name, inputs, outputs, runner, runner.padded, device)
    if callable(served):
        # The batcher places nothing of a batch callable's, so ``auto`` asks torch only when the
        # model loaded it: without torch there is no CUDA context whose memory could be read.
        device = "cpu" if device == "auto" and torch is None else resolve_device(device)
        return ServedModel(
            model_name, inputs, outputs, CallableRunner(served, outputs), lambda n: n, device
        )
    raise ConfigError(
        f"{source} returned {type(served).__name__}; "
        "return a torch.nn.Module or a callable over a list of inputs"
    )
