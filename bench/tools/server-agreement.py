#!/usr/bin/env python3
"""How much a model's greedy text depends on batch composition, through llama-server.

Starts SERVER (a llama-server binary) on MODEL with 8 slots, asks 16 prompts of different lengths
for 32 greedy tokens each (EOS ignored, no prompt cache) one at a time, then all 16 at once, and
prints how many answers are identical and the mean shared prefix (characters, relative). On a
random-weight model most answers differ (rounding changes with the batch and decode amplifies it);
`cargo xtask synth --stable` writes models whose answers mostly agree, so that runs can be compared
by their text.

Usage: server-agreement.py SERVER MODEL [PORT] [-- extra llama-server arguments, e.g. -nr -ngl 99]
"""
import concurrent.futures
import json
import subprocess
import sys
import time
import urllib.request


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
    if len(args) not in (2, 3):
        sys.exit(__doc__)
    server, model = args[0], args[1]
    port = int(args[2]) if len(args) == 3 else 18080
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [server, "-m", model, "-np", "8", "-c", "4096", "--host", "127.0.0.1", "--port", str(port), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                sys.exit(f"llama-server exited ({proc.returncode}) before it answered /health")
            try:
                if urllib.request.urlopen(url + "/health").status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("llama-server did not answer /health within 300 s")
            time.sleep(0.5)

        words = "the quick brown fox jumps over a lazy dog while seven small cats sing about rivers".split()
        prompts = [" ".join(words[(3 * i) % 10 : (3 * i) % 10 + 2 + i % 9]) + f" {i}" for i in range(16)]

        def ask(prompt):
            body = {"prompt": prompt, "n_predict": 32, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
            request = urllib.request.Request(
                url + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            return json.load(urllib.request.urlopen(request, timeout=600))["content"]

        alone = [ask(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(ask, prompts))

        def shared(a, b):
            n = 0
            for x, y in zip(a, b):
                if x != y:
                    break
                n += 1
            return n / max(1, len(a), len(b))

        same = sum(a == b for a, b in zip(alone, together))
        prefix = sum(shared(a, b) for a, b in zip(alone, together)) / len(prompts)
        print(f"{model}: {same}/{len(prompts)} answers identical alone and together, mean shared prefix {prefix:.2f}")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
