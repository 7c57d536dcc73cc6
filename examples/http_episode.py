"""One complete episode over plain HTTP (no OpenEnv, no WebSocket): for any RL framework.

    docker compose up -d          # or: coding-env serve &
    python examples/http_episode.py [http://127.0.0.1:8000]

It waits for the service to answer `/health` (a service just started is still filling its pool),
sends `CODING_ENV_API_TOKEN` when set, and ends with where the episode viewer shows the episode.
"""

import os
import sys
import time

import httpx

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
token = os.environ.get("CODING_ENV_API_TOKEN")
SOLUTION = "def fizzbuzz(n: int) -> str:\n    return 'Fizz' * (n % 3 == 0) + 'Buzz' * (n % 5 == 0) or str(n)\n"

with httpx.Client(base_url=base_url, timeout=120, headers={"authorization": f"Bearer {token}"} if token else {}) as http:
    for _ in range(120):  # up to 2 minutes for a service that is starting
        try:
            if http.get("/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(1)
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
        print(f"read it: {base_url}/viewer/{trajectory['episode_id']}")
    finally:
        http.delete(f"/sessions/{session_id}")
