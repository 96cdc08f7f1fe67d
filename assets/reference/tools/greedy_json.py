#!/usr/bin/env python3
"""Runs greedy_ids (build-greedy-ids.sh) on one prompt and prints the JSON entry the reference files
hold under greedy.prompts: prompt ids, generated ids and text, top-2 logits and margin per step.
    usage: greedy_json.py GREEDY_IDS MODEL.gguf N "PROMPT" """
import json
import subprocess
import sys

exe, model, n, prompt = sys.argv[1:5]
run = subprocess.run([exe, "-m", model, "-n", n, prompt], capture_output=True, check=True)
# a random-weight model may emit bytes that are no UTF-8: its text is for reading only
out, err = run.stdout.decode(errors="replace"), run.stderr.decode(errors="replace")
entry = {"prompt": prompt, "prompt_ids": [], "generated_ids": [], "generated_text": "", "steps": []}
for line in err.splitlines():
    f = line.split()
    if f[:1] == ["PROMPT_IDS"]:
        entry["prompt_ids"] = [int(x) for x in f[1:]]
    elif f[:1] == ["STEP"]:
        step, t1, l1, t2, l2 = int(f[1]), int(f[3]), float(f[4]), int(f[6]), float(f[7])
        entry["generated_ids"].append(t1)
        entry["steps"].append({"step": step, "top1": t1, "top1_logit": l1, "top2": t2,
                               "top2_logit": l2, "margin": round(l1 - l2, 5)})
# stdout: the prompt as text (with <bos> where one is added) followed by the generated text.
text = out.rstrip("\n")
text = text[len("<bos>"):] if text.startswith("<bos>") else text
entry["generated_text"] = text[len(prompt):] if text.startswith(prompt) else text
print(json.dumps(entry))
