// A confirmation that lives in the page (a <dialog>), not window.confirm: it can be styled and clicked by tests.

/** Opens the page's confirm dialog; resolves true when the user confirms, false otherwise. */
export function confirmAction({ title, message, confirmLabel = "Confirm", cancelLabel = "Cancel" }) {
  const dialog = document.getElementById("confirm-dialog");
  dialog.querySelector("#confirm-title").textContent = title;
  dialog.querySelector("#confirm-message").textContent = message;
  dialog.querySelector("[data-testid=confirm-yes]").textContent = confirmLabel;
  dialog.querySelector("[data-testid=confirm-no]").textContent = cancelLabel;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), { once: true });
    dialog.showModal();
  });
}
