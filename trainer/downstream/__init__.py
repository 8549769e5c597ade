"""Downstream evaluation as AI2 logs it (OLMo-core's DownstreamEvaluator + olmo_eval's ICLMetric),
without torch: `batches` (eval batches from the frozen instances of contract.downstream, only the
scored positions gathered), `metric` (ICLMetric.compute ported to numpy, OLMo-core's keys),
`score` (the log-likelihoods in JAX, only the scored positions through the LM head), `evaluator`
(DownstreamEvaluator, the periodic evaluator the loop holds) and `python -m trainer.downstream`
(any checkpoint, after the fact).
"""
