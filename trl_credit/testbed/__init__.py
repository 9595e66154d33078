"""A from-scratch tiny-model testbed (docs/testbed.md#the-tiny-testbed): a task with a step checker and two solution
structures (:mod:`trl_credit.tasks.sums`), a character tokenizer and a ~0.3M-parameter Llama built from scratch in
minutes on one CPU thread (:mod:`trl_credit.testbed.model`), on which every trainer learns in CPU-minutes."""

from trl_credit.testbed.model import Recipe, build_model, make_tokenizer, testbed_model_path

__all__ = ["Recipe", "build_model", "make_tokenizer", "testbed_model_path"]
