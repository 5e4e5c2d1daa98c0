"""Structured extraction on the default model: 20 short texts about invented people, each turned into
JSON that must validate against a schema, through LangChain's ``with_structured_output``.

    python cookbook/structured_extraction.py [--model smollm2-135m] [--count 20] [--out extraction.json]

Prints one line per text (the JSON, whether it validates, which fields match the text) and a summary:
how many answers are valid JSON for the schema (every one, by construction) and how many fields the
model got right (what a 135M-parameter model knows how to read).
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

CITIES = ["Quennel", "Brightwater", "Keldmouth", "Varrow", "Lowmarch"]
JOBS = ["engineer", "teacher", "baker", "sailor", "doctor"]
FIRST = ["Ada", "Tomas", "Ida", "Edwin", "Mara", "Jonas", "Lena", "Piet", "Sofi", "Ravi"]
LAST = ["Orrery", "Vell", "Renn", "Hale", "Quist", "Brand", "Moss", "Tarn", "Lind", "Cole"]


class Person(BaseModel):
    """Who a text is about."""

    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=120)
    city: Literal["Quennel", "Brightwater", "Keldmouth", "Varrow", "Lowmarch"]
    occupation: Literal["engineer", "teacher", "baker", "sailor", "doctor"]


def texts(count: int, seed: int = 0) -> list[tuple[str, dict]]:
    """``count`` (text, the facts it states) pairs, the same for a seed."""
    draw = random.Random(seed)
    out = []
    for _ in range(count):
        facts = {"name": f"{draw.choice(FIRST)} {draw.choice(LAST)}", "age": draw.randint(19, 80),
                 "city": draw.choice(CITIES), "occupation": draw.choice(JOBS)}  # fmt: skip
        out.append((f"{facts['name']} is a {facts['age']}-year-old {facts['occupation']} who lives in {facts['city']}.",
                    facts))  # fmt: skip
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    from fusionrag_llm import FusionRAG
    from fusionrag_llm.integrations.langchain import ChatFusionRAG

    chat = ChatFusionRAG(rag=FusionRAG.from_pretrained(args.model, store=":memory:"), max_tokens=160)
    extract = chat.with_structured_output(Person, include_raw=True)
    rows = []
    for text, facts in texts(args.count):
        result = extract.invoke(f"Extract the person described in this text as JSON.\n\nText: {text}")
        raw = result["raw"].content
        try:
            person = Person.model_validate_json(raw)
        except ValidationError:
            person = None
        right = [name for name in facts if person is not None and getattr(person, name) == facts[name]]
        rows.append({"text": text, "answer": raw, "valid": person is not None, "fields_right": right})
        print(f"{'valid' if person else 'INVALID'} {len(right)}/4 {raw}")
    summary = {"model": args.model, "texts": len(rows), "valid_json": sum(r["valid"] for r in rows),
               "fields_right": sum(len(r["fields_right"]) for r in rows), "fields": 4 * len(rows)}  # fmt: skip
    print(f"\n{summary['valid_json']}/{summary['texts']} answers valid for the schema; "
          f"{summary['fields_right']}/{summary['fields']} fields as the texts state them")
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"summary": summary, "rows": rows}, file, indent=1)
    return summary


if __name__ == "__main__":
    main()
