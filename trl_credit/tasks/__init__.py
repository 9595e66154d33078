"""The built-in tasks with ground truth we compute ourselves: the arithmetic task, the ``chain`` task, the
tiny testbed's ``sums`` task (each with its step checker), and the reward functions.
"""
