"""Downstream evaluation as AI2 logs it (OLMo-core's DownstreamEvaluator + olmo_eval's ICLMetric),
without torch: `batches` (eval batches from the frozen instances of contract.downstream, only the
scored positions gathered) and `metric` (ICLMetric.compute ported to numpy, OLMo-core's keys).
"""
