"""What one chip runs: the mesh learner, the two modes' programs (actors mode and Anakin),
the sync strategy applied around any algorithm's update, greedy evaluation, and the
compile cache. Knows nothing of Ray or processes: a learner steps in-process too.
"""
