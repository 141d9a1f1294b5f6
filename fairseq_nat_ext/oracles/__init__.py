from .levenshtein import EditOracle, edit_distance_table, lcs_table, levenshtein_oracle  # noqa: F401
from .insertion import InsertionOracle, insertion_oracle  # noqa: F401
