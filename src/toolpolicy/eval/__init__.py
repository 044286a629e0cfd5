"""Evaluation: pass@k, pass^k, tool-use metrics and evaluation runs."""
