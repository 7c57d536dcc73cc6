"""One complete episode over plain HTTP (no OpenEnv, no WebSocket): for any RL framework.

    coding-env serve &            # or: docker compose up
    python examples/http_episode.py [http://127.0.0.1:8000]
"""

import sys

import httpx

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
SOLUTION = "def fizzbuzz(n: int) -> str:\n    return 'Fizz' * (n % 3 == 0) + 'Buzz' * (n % 5 == 0) or str(n)\n"

with httpx.Client(base_url=base_url, timeout=120) as http:
    session_id = http.post("/sessions").raise_for_status().json()["session_id"]

    def step(tool_name: str, **arguments: object) -> dict:
        action = {"type": "call_tool", "tool_name": tool_name, "arguments": arguments}
        return http.post(f"/sessions/{session_id}/step", json={"action": action}).raise_for_status().json()

    try:
        reset = http.post(f"/sessions/{session_id}/reset", json={"task_id": "builtin/fizzbuzz"}).raise_for_status().json()
        print("task:", reset["observation"]["prompt"])
        print("tools:", [tool["function"]["name"] for tool in reset["observation"]["tools"]])

        for tool_name, arguments in [
            ("bash", {"command": "cat solution.py"}),
            ("write_file", {"path": "solution.py", "content": SOLUTION}),
            ("run_tests", {}),
        ]:
            observation = step(tool_name, **arguments)["observation"]
            print(f"{tool_name}: error_kind={observation['error_kind']}\n{observation['output']}")

        result = step("submit")
        graded = result["observation"]
        print("done:", result["done"], "reward:", result["reward"], "tests:", graded["tests_passed"], "/", graded["tests_total"])
        trajectory = http.get(f"/sessions/{session_id}/trajectory").raise_for_status().json()
        print("recorded steps:", len(trajectory["steps"]))
    finally:
        http.delete(f"/sessions/{session_id}")
