"""Load test of served variants: streaming OpenAI client, arrivals, metrics, comparison and reports.

Run ``depthprune loadtest --help``. Importing this package pulls in neither torch nor vLLM.
"""

from loadtest.arrivals import arrival_offsets
from loadtest.benchmark import Benchmark, Measurement, SweepConfig, build_result
from loadtest.blocks import block_counts
from loadtest.capacity import CapacityConfig, CapacitySearch, search_capacity
from loadtest.client import RequestResult, completion_payload, served_models, stream_completion
from loadtest.compare import BlockCounts, geometric_mean, ratios_to_baseline, speedup_summary
from loadtest.config import LoadConfig
from loadtest.metrics import compute_metrics, parse_goodput, summarize
from loadtest.prompts import Prompt, build_prompts
from loadtest.report import markdown_report, write_report
from loadtest.runner import RunResult, interleaved_rounds, timed_run
from loadtest.session import LoadTestPlan, run_loadtest
from loadtest.slo import Slo, parse_slo

__all__ = [
    "Benchmark",
    "BlockCounts",
    "CapacityConfig",
    "CapacitySearch",
    "LoadConfig",
    "LoadTestPlan",
    "Measurement",
    "Prompt",
    "RequestResult",
    "RunResult",
    "Slo",
    "SweepConfig",
    "arrival_offsets",
    "block_counts",
    "build_prompts",
    "build_result",
    "completion_payload",
    "compute_metrics",
    "geometric_mean",
    "interleaved_rounds",
    "markdown_report",
    "parse_slo",
    "parse_goodput",
    "ratios_to_baseline",
    "run_loadtest",
    "search_capacity",
    "served_models",
    "speedup_summary",
    "stream_completion",
    "summarize",
    "timed_run",
    "write_report",
]
