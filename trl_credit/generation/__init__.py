"""The hooks into HF transformers' ``generate`` that trl_credit's generation calls run through
(``hooks``: transformers and torch only, never TRL).
"""
