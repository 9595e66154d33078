"""Where trl_credit meets TRL's private API (docs/design.md#the-trl-bridge): the supported versions and
the contract of every private it reads (``compat``), and the functions a part calls for them
(``privates``).
"""
