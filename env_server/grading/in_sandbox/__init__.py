"""Programs that run inside the grading sandbox, standard library only: each file is copied there
as it is (read with `importlib.resources`), so none may import anything of the service. The host
imports `typed_values` and `pytest_guard`'s exit statuses from here as well: one copy of each."""
