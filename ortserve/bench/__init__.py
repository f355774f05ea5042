"""`ortserve bench`: measure a running OpenAI-compatible server the way `vllm bench serve` does.

dataset.py builds prompts of exact token lengths, arrivals.py times them, request.py streams one
request, metrics.py turns the timings into numbers, report.py prints and saves them, and
serve.py ties the run together. server_metrics.py reads a server's Prometheus counters.
"""
