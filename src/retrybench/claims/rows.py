"""The report's summary rows: the paper's findings and sections, each with the claim it makes."""

from __future__ import annotations

from retrybench.claims.model import Row

__all__ = ["ROWS"]

FINDING1 = Row(key="finding1", title="Finding 1 (Section 4)",
               claim="Retries alone keep every model from recovering after the 2.7 C-hat pulse, cancellation alone "
                     "does not restore service while clients retry, and every model recovers after a 1.5 C-hat "
                     "pulse.")
FINDING2 = Row(key="finding2", title="Finding 2 (Section 5.1)",
               claim="Most of the engine's prompt work under cancellation goes to executions it later aborts; at "
                     "8,192 batched tokens about half of it is in steps already issued, and 2,048-token steps cut "
                     "that share.")
FINDING3 = Row(key="finding3", title="Finding 3 (Section 5.2)",
               claim="Retries are first scheduled, if at all, close to their deadline, about one deadline after "
                     "their predecessor's abort; smaller steps neither change that nor restore service.")
FINDING4 = Row(key="finding4", title="Finding 4 (Section 5.3)",
               claim="vLLM's prompt-token counter records a prompt only at its first output, so under retries and "
                     "cancellation it falls a fifth to two thirds short of the admission counter.")
FINDING5 = Row(key="finding5", title="Finding 5 (Section 6.1)",
               claim="The retry budget and coalescing restore service on all three models, yet only coalescing "
                     "rescues the pulse calls, a third to half of them late.")
FINDING6 = Row(key="finding6", title="Finding 6 (Section 6.2)",
               claim="vLLM's cap at 100 restores service but delivers fewer pulse calls; newest-first dequeue under "
                     "a proxy cap restores service and delivers more; arrival order does not, even with a deadline "
                     "check.")
FINDING7 = Row(key="finding7", title="Finding 7 (Section 6.3)",
               claim="Cancellation propagated at once leaves coalescing nothing to attach to; deferring it by 10 s "
                     "lets retries attach again and restores service.")
SECTION64 = Row(key="section64", title="Section 6.4",
                claim="Budget-first refuses retries while their call still has a live execution; lookup-first "
                      "refuses none and delivers every pulse and hold call.")
SECTION65 = Row(key="section65", title="Section 6.5",
                claim="Every recovered run, in every block, created executions at the proxy below C-hat.")
SECTION42_2X = Row(key="section42-2x", title="Section 4.2, 2 C-hat pulse", uncertain=True,
                   claim="With retries on, after a 2 C-hat pulse the outcomes split (one run per cell); the paper "
                         "draws no boundary.")
SECTION62_Q338 = Row(key="section62-q338", title="Section 6.2, Q = 338", uncertain=True,
                     claim="vLLM's cap at ceil(120 C-hat) = 338 recovered in one of two runs per cancellation "
                           "setting; the paper draws no conclusion.")

ROWS: tuple[Row, ...] = (FINDING1, FINDING2, FINDING3, FINDING4, FINDING5, FINDING6, FINDING7, SECTION64, SECTION65,
                         SECTION42_2X, SECTION62_Q338)
