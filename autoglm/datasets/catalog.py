"""The public traces the project uses, and the excerpts of them it ships.

Each upstream trace is named once here with where it comes from, its licence, the work to cite
and its SHA-256, so a copy fetched from anywhere can be checked byte for byte. A trace's
``relative_path`` mirrors the upstream data set's own folders (the layout of
``shared/autoscaling-traces/``), so any folder holding copies in that layout serves as a cache.

Excerpts are committed with the package: raw rows where the licence allows it (Azure, CC-BY 4.0),
derived aggregates only otherwise (Alibaba clusterdata terms). Their checksums are recorded too,
so a test notices an excerpt edited by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AZURE_LICENCE = "CC-BY 4.0 (https://creativecommons.org/licenses/by/4.0/)"
AZURE_CITATION = (
    "Pratyush Patel, Esha Choukse, Chaojie Zhang, Aashaka Shah, Íñigo Goiri, Saeed Maleki, "
    "Ricardo Bianchini. Splitwise: Efficient generative LLM inference using phase splitting. "
    "ISCA 2024."
)
AZURE_BASE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
AZURE_HOME = (
    "https://github.com/Azure/AzurePublicDataset/blob/master/AzureLLMInferenceDataset2023.md"
)

ALIBABA_LICENCE = (
    "Alibaba clusterdata terms: research or study use (https://github.com/alibaba/clusterdata)"
)
ALIBABA_CITATION = (
    "Yanying Lin, Shuaipeng Wu, Shutian Luo, Hong Xu, Haiying Shen, Chong Ma, Min Shen, Le Chen, "
    "Chengzhong Xu, Lin Qu, Kejiang Ye. Understanding Diffusion Model Serving in Production: "
    "A Top-Down Analysis of Workload, Scheduling, and Resource Efficiency. SoCC 2025."
)
ALIBABA_BASE = (
    "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-v2026-GenAI/"
)
ALIBABA_HOME = "https://github.com/alibaba/clusterdata/tree/master/cluster-trace-v2026-GenAI"

DATA_DIR = Path(__file__).with_name("data")


@dataclass(frozen=True)
class Trace:
    """A public trace fetched on demand; never committed."""

    name: str
    relative_path: str  # inside a traces folder, in the upstream data set's layout
    url: str
    sha256: str
    size: int  # bytes
    licence: str
    citation: str
    homepage: str
    description: str


@dataclass(frozen=True)
class Excerpt:
    """A small file committed in ``autoglm/datasets/data/``, derived from one trace."""

    name: str
    file_name: str
    source: str  # the Trace it is derived from
    sha256: str
    licence: str
    citation: str
    description: str

    @property
    def path(self) -> Path:
        return DATA_DIR / self.file_name


def _azure(name: str, file_name: str, sha256: str, size: int, description: str) -> Trace:
    return Trace(
        name=name,
        relative_path=f"azure-llm-2023/{file_name}",
        url=AZURE_BASE + file_name,
        sha256=sha256,
        size=size,
        licence=AZURE_LICENCE,
        citation=AZURE_CITATION,
        homepage=AZURE_HOME,
        description=description,
    )


def _alibaba(name: str, file_name: str, sha256: str, size: int, description: str) -> Trace:
    return Trace(
        name=name,
        relative_path=f"alibaba-genai-2026/{file_name}",
        url=ALIBABA_BASE + file_name,
        sha256=sha256,
        size=size,
        licence=ALIBABA_LICENCE,
        citation=ALIBABA_CITATION,
        homepage=ALIBABA_HOME,
        description=description,
    )


TRACES: dict[str, Trace] = {
    t.name: t
    for t in (
        _azure(
            "azure-llm-code",
            "AzureLLMInferenceTrace_code.csv",
            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
            320117,
            "Azure LLM inference, coding service: one hour of requests (bursty), token counts",
        ),
        _azure(
            "azure-llm-conv",
            "AzureLLMInferenceTrace_conv.csv",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
            719188,
            "Azure LLM inference, conversation service: one hour of requests (smooth)",
        ),
        _alibaba(
            "genai-requests",
            "lora_request_trace.csv",
            "263fb88f1095f62d360cf89ded8cfc24fa2c5d111c1b16e7aaa9ccbfc4b37d78",
            2012418,
            "Alibaba GenAI (Stable Diffusion) serving: 23 days of requests with execution time",
        ),
        _alibaba(
            "genai-gpu-duty-cycle",
            "pod_gpu_duty_cycle_anon.tar.gz",
            "c4070218189b2811995c30dd9fefb8a793a83a54dccebe7b41cab2d123916855",
            832148,
            "Alibaba GenAI: per-pod GPU duty cycle (percent), 22.8 h at about 57 s",
        ),
        _alibaba(
            "genai-gpu-memory",
            "pod_gpu_memory_used_bytes_anon.tar.gz",
            "662be431f2d24a003c3a0b28383155fccceefb7e83dea14f912166edc9129132",
            1144101,
            "Alibaba GenAI: per-pod GPU memory used (bytes)",
        ),
        _alibaba(
            "genai-qps",
            "qps.tar.gz",
            "6bd1a21e3f916740df1e768fc43346148f1598b15fcc68c658a8faf1f87461c6",
            119651,
            "Alibaba GenAI: gateway QPS per container and request type",
        ),
        _alibaba(
            "genai-queue-size",
            "queue_size_raw_anon.tar.gz",
            "585499916ed94900921e72c01213a618cad52443fc3f20f1e0e7ad4c4bb11798",
            4863,
            "Alibaba GenAI: gateway queue size",
        ),
        _alibaba(
            "genai-queue-time",
            "queue_rt_raw_anon.tar.gz",
            "419deaccd1cc33ef3050b676f75a49af726c169de62ae29344ea2fdf1d4f3819",
            134246,
            "Alibaba GenAI: gateway queueing time (ms)",
        ),
        _alibaba(
            "genai-model-latency",
            "model_predict_data_anon.tar.gz",
            "9d97e16c2f2e2ef009edc8e67a4947bb708432123873e417a69089e4c864e87d",
            52690,
            "Alibaba GenAI: pure inference latency (ms)",
        ),
        _alibaba(
            "genai-pipeline-latency",
            "pipeline_inference_data_anon.tar.gz",
            "4899bd06c7089764046ae8b1ba5dfd243e47062c96d9ff34f7d344558602bbd5",
            255769,
            "Alibaba GenAI: end-to-end pipeline response time (ms)",
        ),
    )
}


EXCERPTS: dict[str, Excerpt] = {
    e.name: e
    for e in (
        Excerpt(
            name="azure-llm-code-10min",
            file_name="azure_llm_code_10min.csv",
            source="azure-llm-code",
            sha256="7e0e327410d5a6c433c0d150c131b33e60f4957a5516fa1b855d87085cc1ae3a",
            licence=AZURE_LICENCE,
            citation=AZURE_CITATION,
            description="the first 10 minutes of azure-llm-code, rows unchanged (1,482 requests)",
        ),
        Excerpt(
            name="azure-llm-conv-10min",
            file_name="azure_llm_conv_10min.csv",
            source="azure-llm-conv",
            sha256="38792e383c1cefdd1e163282600f4efacb77e24f2548569c2746893b6f969aac",
            licence=AZURE_LICENCE,
            citation=AZURE_CITATION,
            description="the first 10 minutes of azure-llm-conv, rows unchanged (2,863 requests)",
        ),
        Excerpt(
            name="genai-requests-hourly",
            file_name="genai_requests_hourly.csv",
            source="genai-requests",
            sha256="62776d822bffbe5aac3e6777980bdac84959fc63fb8a2876b83e6148d3961fc1",
            licence=ALIBABA_LICENCE,
            citation=ALIBABA_CITATION,
            description="requests per hour and their mean execution time, all 23 days (aggregate)",
        ),
        Excerpt(
            name="genai-gpu-duty-cycle-mean",
            file_name="genai_gpu_duty_cycle_mean.csv",
            source="genai-gpu-duty-cycle",
            sha256="1bc76cb9d30a74d876a0db150ded80fcaab0a65a80aa65bec62198ba0e178a30",
            licence=ALIBABA_LICENCE,
            citation=ALIBABA_CITATION,
            description="mean GPU duty cycle over the reporting pods per sample (aggregate)",
        ),
    )
}
